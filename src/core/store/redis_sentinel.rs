//! What the sentinels announce (SPEC 19.3): a thread of the store's own subscribes to
//! `+switch-master` on one sentinel at a time, so that the store leaves a primary the
//! moment the sentinels have promoted another, rather than when the old one stops
//! taking writes. After `SENTINEL FAILOVER` the demoted primary goes on answering as a
//! primary until the sentinels reconfigure it (about 10 s later): writes sent to it
//! meanwhile are lost when it resynchronises from the new primary.
//!
//! * The thread publishes the primary it learnt, with a generation; the store compares
//!   the generation with the one it saw last (one atomic load per call, no round trip)
//!   and, on a change naming another node, connects there (checked with `ROLE`).
//! * On every (re)subscription the thread asks that sentinel (`SENTINEL MASTER`) which
//!   primary it names, so that a switch announced while no sentinel was listened to is
//!   not missed; a sentinel that names an older configuration (a lower config epoch)
//!   than the one already learnt is not believed.
//! * A dead sentinel is left for the next one; when none answers the thread waits a
//!   second before going round again (doubling, up to 30 s, while none does). Reads time out every [`POLL`] so that the thread
//!   sees it is to stop; a quiet subscription is pinged every [`PING_EVERY`].
//! * The thread holds no lock of the store's and never the GIL. Dropping the [`Watch`]
//!   (the store closed, with the GIL released) stops it and waits for it to end, at
//!   most [`STOP_WAIT`] (it ends within a read, [`POLL`]; one stuck connecting to a
//!   sentinel that does not answer ends by itself, after its timeout); in a forked child
//!   it does not exist: the store forgets it there ([`Watch::forget`]) and the child's
//!   new store starts its own.
use redis::{Client, Value};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The channel a sentinel publishes a new primary on:
/// `<service> <old-ip> <old-port> <new-ip> <new-port>`.
const CHANNEL: &str = "+switch-master";
/// How long one read waits before the thread looks whether it is to stop.
const POLL: Duration = Duration::from_millis(100);
/// How long dropping the watch waits for the thread to end.
const STOP_WAIT: Duration = Duration::from_millis(500);
/// A subscription quiet this long is pinged (a sentinel that vanished without closing
/// the connection is left).
const PING_EVERY: Duration = Duration::from_secs(5);
/// After every sentinel failed, the pause before going round again: doubled after each
/// such round, up to [`MAX_RETRY_PAUSE`] (sentinels that refuse the subscription cost
/// little).
const RETRY_PAUSE: Duration = Duration::from_secs(1);
const MAX_RETRY_PAUSE: Duration = Duration::from_secs(30);
/// After a subscription ended, the pause before the next sentinel.
const NEXT_PAUSE: Duration = Duration::from_millis(50);
/// The name of the thread (`/proc/<pid>/task/*/comm`).
pub const THREAD_NAME: &str = "qe-sentinel";

/// A primary as `(host, port)`.
pub type Addr = (String, u16);

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// Bumped every time `primary` is set.
    generation: AtomicU64,
    primary: Mutex<Option<Addr>>,
    /// The thread has ended.
    ended: Mutex<bool>,
    ended_cv: Condvar,
}

impl Shared {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Waits until the thread has ended, at most `wait`; true when it has.
    fn wait_ended(&self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        while !*ended {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            ended =
                self.ended_cv.wait_timeout(ended, deadline - now).unwrap_or_else(PoisonError::into_inner).0;
        }
        true
    }

    fn publish(&self, addr: Addr) {
        *self.primary.lock().unwrap_or_else(PoisonError::into_inner) = Some(addr);
        self.generation.fetch_add(1, Ordering::AcqRel);
    }
}

/// The subscriber thread of one store.
pub struct Watch {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Connect and I/O timeouts of the thread's connections.
#[derive(Clone, Copy)]
pub struct Timeouts {
    pub connect: Duration,
    pub io: Duration,
}

impl Watch {
    /// Starts the thread listening to `sentinels` (name, client) for `service`.
    pub fn start(sentinels: Vec<(String, Client)>, service: String, t: Timeouts) -> std::io::Result<Watch> {
        let shared = Arc::new(Shared::default());
        let state = Arc::clone(&shared);
        let thread = std::thread::Builder::new().name(THREAD_NAME.into()).spawn(move || {
            let _end = ThreadEnd(Arc::clone(&state));
            Listener { shared: state, sentinels, service, t, last: None, epoch: None }.run()
        })?;
        Ok(Watch { shared, thread: Some(thread) })
    }

    /// The primary the sentinels announced since generation `seen` (which it moves on),
    /// if any: one atomic load when nothing changed.
    pub fn announced(&self, seen: &mut u64) -> Option<Addr> {
        let now = self.shared.generation.load(Ordering::Acquire);
        if now == *seen {
            return None;
        }
        *seen = now;
        self.shared.primary.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// In a forked child: the thread is the parent's (not in this process): nothing of
    /// it is touched.
    pub fn forget(self) {
        std::mem::forget(self);
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            // Past the wait it is left to end by itself (not joined).
            if self.shared.wait_ended(STOP_WAIT) {
                let _ = t.join();
            }
        }
    }
}

/// Marks the thread ended when it returns (or unwinds).
struct ThreadEnd(Arc<Shared>);

impl Drop for ThreadEnd {
    fn drop(&mut self) {
        *self.0.ended.lock().unwrap_or_else(PoisonError::into_inner) = true;
        self.0.ended_cv.notify_all();
    }
}

/// The thread's own state.
struct Listener {
    shared: Arc<Shared>,
    sentinels: Vec<(String, Client)>,
    service: String,
    t: Timeouts,
    /// The primary last published.
    last: Option<Addr>,
    /// The config epoch of `last`, as far as known (a switch heard bumps it by one; a
    /// sentinel asked tells it).
    epoch: Option<u64>,
}

/// Why one subscription ended.
enum Ended {
    Stopped,
    /// It had been subscribed (the sentinel was alive), then the connection failed.
    Lost,
    /// No subscription was made.
    Failed,
}

impl Listener {
    fn run(mut self) {
        let n = self.sentinels.len();
        let (mut i, mut failed, mut pause) = (0, 0, RETRY_PAUSE);
        while !self.shared.stopped() && n > 0 {
            match self.listen(i) {
                Ended::Stopped => return,
                Ended::Lost => {
                    (failed, pause) = (0, RETRY_PAUSE);
                    std::thread::park_timeout(NEXT_PAUSE);
                }
                Ended::Failed => failed += 1,
            }
            i = (i + 1) % n;
            if failed >= n {
                failed = 0;
                std::thread::park_timeout(pause);
                pause = (pause * 2).min(MAX_RETRY_PAUSE);
            }
        }
    }

    fn connect(&self, i: usize) -> redis::RedisResult<redis::Connection> {
        let con = self.sentinels[i].1.get_connection_with_timeout(self.t.connect)?;
        con.set_read_timeout(Some(self.t.io))?;
        con.set_write_timeout(Some(self.t.io))?;
        Ok(con)
    }

    /// Subscribes on sentinel `i`, asks it which primary it names, then follows its
    /// announcements until the connection fails or the thread is to stop.
    fn listen(&mut self, i: usize) -> Ended {
        let Ok(mut con) = self.connect(i) else { return Ended::Failed };
        let mut sub = con.as_pubsub();
        if sub.subscribe(CHANNEL).is_err() {
            return Ended::Failed;
        }
        // Subscribed first, then asked: no announcement falls between the two.
        match self.ask(i) {
            Ok(Some((addr, epoch))) => self.learn(addr, Some(epoch)),
            Ok(None) => {}
            Err(_) => return Ended::Failed,
        }
        if sub.set_read_timeout(Some(POLL)).is_err() {
            return Ended::Failed;
        }
        let mut heard = Instant::now();
        loop {
            if self.shared.stopped() {
                return Ended::Stopped;
            }
            match sub.get_message() {
                Ok(msg) => {
                    heard = Instant::now();
                    if msg.get_channel_name() != CHANNEL {
                        continue;
                    }
                    let Ok(payload) = msg.get_payload::<String>() else { continue };
                    if let Some(addr) = switched_to(&payload, &self.service) {
                        self.learn(addr, None);
                    }
                }
                Err(e) if e.is_timeout() => {
                    if heard.elapsed() < PING_EVERY {
                        continue;
                    }
                    let pinged = sub
                        .set_read_timeout(Some(self.t.io))
                        .and_then(|()| sub.ping::<Value>())
                        .and_then(|_| sub.set_read_timeout(Some(POLL)));
                    if pinged.is_err() {
                        return Ended::Lost;
                    }
                    heard = Instant::now();
                }
                Err(_) => return Ended::Lost,
            }
        }
    }

    /// The primary sentinel `i` names for the service, with its config epoch (`None`
    /// when it does not know the service).
    fn ask(&self, i: usize) -> redis::RedisResult<Option<(Addr, u64)>> {
        let mut con = self.connect(i)?;
        let reply = match redis::cmd("SENTINEL").arg("MASTER").arg(&self.service).query::<Value>(&mut con) {
            Ok(v) => v,
            // "No such master with that name", or a user not allowed `SENTINEL MASTER`:
            // nothing to learn here (the announcements are still heard).
            Err(e) if e.code().is_some() => return Ok(None),
            Err(e) => return Err(e),
        };
        let fields = fields(&reply);
        let get = |k: &str| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v.as_str());
        let (Some(ip), Some(port)) = (get("ip"), get("port").and_then(|p| p.parse::<u16>().ok())) else {
            return Ok(None);
        };
        let epoch = get("config-epoch").and_then(|e| e.parse::<u64>().ok()).unwrap_or(0);
        Ok(Some(((ip.to_string(), port), epoch)))
    }

    /// Takes in a primary: heard announced (`epoch` `None`), or named by a sentinel
    /// asked, with its config epoch (not believed when older than what was learnt).
    fn learn(&mut self, addr: Addr, epoch: Option<u64>) {
        match epoch {
            Some(e) if self.epoch.is_some_and(|known| e < known) => return,
            Some(e) => self.epoch = Some(e),
            None if self.last.as_ref() != Some(&addr) => self.epoch = self.epoch.map(|e| e + 1),
            None => {}
        }
        if self.last.as_ref() != Some(&addr) {
            self.last = Some(addr.clone());
            self.shared.publish(addr);
        }
    }
}

/// The new primary a `+switch-master` payload announces for `service`.
fn switched_to(payload: &str, service: &str) -> Option<Addr> {
    // The service's name comes first and may hold spaces: the four addresses are last.
    let mut parts = payload.rsplitn(5, ' ');
    let port = parts.next()?.parse::<u16>().ok()?;
    let ip = parts.next()?;
    let (_old_port, _old_ip) = (parts.next()?, parts.next()?);
    (parts.next()? == service && !ip.is_empty()).then(|| (ip.to_string(), port))
}

/// Field/value pairs of a `SENTINEL MASTER` reply (a flat array in RESP2, a map in RESP3).
fn fields(v: &Value) -> Vec<(String, String)> {
    let text = |v: &Value| match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        Value::Int(i) => Some(i.to_string()),
        _ => None,
    };
    match v {
        Value::Array(a) => a.chunks(2).filter_map(|c| Some((text(c.first()?)?, text(c.get(1)?)?))).collect(),
        Value::Map(m) => m.iter().filter_map(|(k, v)| Some((text(k)?, text(v)?))).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_come_apart() {
        assert_eq!(switched_to("qe 127.0.0.1 6379 127.0.0.1 6380", "qe"), Some(("127.0.0.1".into(), 6380)));
        assert_eq!(switched_to("other 127.0.0.1 6379 127.0.0.1 6380", "qe"), None);
        assert_eq!(switched_to("my svc 10.0.0.1 1 ::1 2", "my svc"), Some(("::1".into(), 2)));
        assert_eq!(switched_to("qe 127.0.0.1 6379 127.0.0.1 x", "qe"), None);
        assert_eq!(switched_to("qe 6380", "qe"), None);
    }

    #[test]
    fn an_older_configuration_is_not_believed() {
        let shared = Arc::new(Shared::default());
        let mut l = Listener {
            shared: Arc::clone(&shared),
            sentinels: Vec::new(),
            service: "qe".into(),
            t: Timeouts { connect: Duration::from_millis(1), io: Duration::from_millis(1) },
            last: None,
            epoch: None,
        };
        let w = Watch { shared: Arc::clone(&shared), thread: None };
        let a = ("h".to_string(), 1);
        let b = ("h".to_string(), 2);
        let mut seen = 0;
        l.learn(a.clone(), Some(3));
        assert_eq!(w.announced(&mut seen), Some(a.clone()));
        assert_eq!(w.announced(&mut seen), None, "nothing new");
        l.learn(b.clone(), None); // heard: epoch 4 at least
        assert_eq!(w.announced(&mut seen), Some(b.clone()));
        l.learn(a.clone(), Some(3)); // a sentinel that has not heard yet
        assert_eq!(w.announced(&mut seen), None);
        l.learn(b.clone(), Some(4));
        l.learn(b.clone(), None); // the same switch heard again
        assert_eq!(l.epoch, Some(4));
        assert_eq!(w.announced(&mut seen), None);
        l.learn(a.clone(), Some(6)); // a later failover, learnt on resubscribing
        assert_eq!(w.announced(&mut seen), Some(a));
    }
}
