//! The Redis backend: one quota truth for router workers on several hosts.
//!
//! Everything under one key prefix `P` (default `quotaengine`, `?prefix=` in the URL):
//!
//! | key | type | holds |
//! |---|---|---|
//! | `P:log` | stream | every usage row and every lease insert/delete, in commit order |
//! | `P:leases` | hash | live leases: id -> key, expires, tokens, created, route |
//! | `P:cooldowns`, `P:keys`, `P:models`, `P:caps`, `P:history` | hash | the small tables (a cooldown field with an empty key benches its model for every key, SPEC 21.1) |
//! | `P:ver` | hash | a version per small table, bumped by every change to it (a counter that starts, again or anew, starts at the server's time in µs) |
//! | `P:quota` | hash | observed provider quota state (versioned as the small tables) |
//! | `P:logs` | stream | `server_logs` (capped at about 10,000) |
//! | `P:lock` | string | the write lock: its owner, with a time to live |
//! | `P:late` | zset | usage entries written after the clock stepped back: id -> time |
//! | `P:sweep` | hash | where the retention sweep goes on from, per kept model (SPEC 14.2) |
//! | `P:prices` | hash | model prices (SPEC 23.1), a small table: `platform SEP model` -> four integers of p$ |
//! | `P:platform_limits` | hash | platform limits (SPEC 23.3), a small table: `platform` -> its limits |
//! | `P:tenant_limits` | hash | tenant declarations (SPEC 23.2), a small table: `tenant` -> `tz SEP limits` |
//! | `P:epoch` | string | the store's identity, a random id set when it is first opened (SPEC 24.4) |
//! | `P:refilled` | hash | engine -> the lost epoch it wrote back (SPEC 24.4: once each) |
//!
//! All access goes through one Lua script (`redis.lua`), so each step is atomic on the
//! server. A section that decides (a lease, a failure) takes the lock and reads what
//! changed in one round trip (`begin`), then writes and drops the lock in a second
//! (`commit`). A section that only appends (`success`, `release`) is one round trip:
//! it reads what changed and writes, and is refused while another engine holds the
//! lock, so it never lands inside someone else's decision. A read (`check()`) is one
//! round trip. Stream ids follow the writers' clocks, so usage since a time is a range
//! read; each entry names its writer, which skips it when it reads the feed.
//!
//! Every call that writes carries an identity, this engine's next sequence number,
//! and the script applies a call at most once (SPEC 19.2): a call whose reply was lost
//! (the connection cut, the server restarted) is kept here and sent again under its
//! identity before anything else once the server answers, and the server skips its
//! writes when it had applied them (`P:applied:<owner>` holds the last applied
//! number, for a day after the writer's last write). The check runs inside the
//! script: still one round trip per call.
//!
//! A store that lost its data (a restart without persistence, `FLUSHALL`, an empty
//! server in its place) has lost `P:epoch` with it: the script refuses every call of
//! an engine that knows another epoch (status `lost`), and the store writes back what
//! the engine knows before the call goes on (mode `refill`, SPEC 24.4): the small
//! tables as it last read them (each item only where absent, so engines refilling at
//! once leave one copy), its own live leases and its own usage rows that retention
//! keeps (each engine sends only its own, so usage is counted once; each entry names
//! the lost epoch, the id the row had in it and its writer, and an engine that had
//! read that row, or wrote it, skips it: its windows count it already), and takes the
//! store's new epoch. Then it reads everything afresh, and
//! the call is sent again (a decision conflicts and is made again). While the refill
//! fails, so does every call: the engine, which logged the loss as an error, serves
//! degraded.
//!
//! The lock has a time to live (10 s) so that a host that dies holding it does not
//! stop the fleet; a section takes microseconds, so only a process stopped for that
//! long inside a section could let two decisions overlap. The lock holds its owner's
//! id: a `begin` whose reply was lost, or a locked section rolled back without a
//! connection, may have left it ours, and our next round trip drops it first
//! (`settle`), so that the fleet does not wait out its time to live.
//!
//! Every wait has a bound: connecting (at most the busy timeout, 0.1 to 5 s), each
//! read and write (the busy timeout, 1 to 30 s, set on every connection at connect:
//! server, sentinel, cluster node), the lock (the busy timeout per script call) and
//! reconnecting (200 ms apart after a failed connect). A connection that timed out,
//! was cut or brought a reply out of step is dropped (`lost_connection`,
//! `desynchronised`).
use super::redis_sentinel::{self, Watch};
use super::redis_topology::{self as topology, Link, Topology};
use super::{Changes, LeaseRow, LogRow, QuotaStateRow, Store, StoreResult, UsageFilter, UsageRow, Write};
use crate::core::error::StoreError;
use codec::{parse_i64, parse_lease, parse_log, parse_quota, parse_usage};
use redis::Value;

mod codec;
pub mod url;
use codec::{array, int, pairs, text};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
pub use url::is_redis_url;

const SCRIPT: &str = include_str!("redis.lua");
const SEP: char = '\u{1f}';
/// The versioned tables; a change to any but the last (the observed quota, which the
/// `headroom` pick may read up to 5 s old, SPEC §8.2) conflicts with every decision.
const TABLES: [&str; 11] = [
    "cooldowns",
    "keys",
    "models",
    "caps",
    "history",
    "calendars",
    "priorities",
    "prices",
    "platform_limits",
    "tenant_limits",
    "quota",
];
const LOCK_TTL_MS: i64 = 10_000;
const MAX_ENTRIES: usize = 10_000;
/// Feed entries one retention sweep looks at, at most (SPEC 14.2: the rows of the
/// models retention keeps longer sit among the others'); the rest at the next commit.
pub(super) const SWEEP_BUDGET: usize = 20_000;
/// After a failed connect, calls fail at once for this long (a blackholed host would
/// otherwise cost its connect timeout on every call while degraded).
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);
/// Every key this engine keeps under its prefix, with its type, checked at open
/// (SPEC 19.1: a key holding another type is refused then, not met later as an outage).
const LAYOUT: [(&str, &str); 24] = [
    ("log", "stream"),
    ("logs", "stream"),
    ("leases", "hash"),
    ("cooldowns", "hash"),
    ("keys", "hash"),
    ("models", "hash"),
    ("caps", "hash"),
    ("history", "hash"),
    ("calendars", "hash"),
    ("priorities", "hash"),
    ("ver", "hash"),
    ("quota", "hash"),
    ("lock", "string"),
    ("lastms", "string"),
    ("history_id", "string"),
    ("log_id", "string"),
    ("applied", "none"),
    ("late", "zset"),
    ("sweep", "hash"),
    ("prices", "hash"),
    ("platform_limits", "hash"),
    ("tenant_limits", "hash"),
    ("epoch", "string"),
    ("refilled", "hash"),
];
/// Own usage rows kept for a refill (SPEC 24.4) before those older than a minute are
/// merged per (route, kind, tenants, UTC minute).
const JOURNAL_COMPACT_MIN: usize = 4096;

/// The writes of a call whose reply was lost, to be sent again under its identity.
struct InDoubt {
    id: u64,
    writes: Vec<String>,
    /// The usage rows among `writes`, kept for a refill once delivered.
    usage: Vec<UsageRow>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Section {
    Read,
    Write,
    Append,
    /// Admissions decided on what was read up to the cursor: committed only if what
    /// they read is unchanged (mode `lease`), else [`StoreError::Conflict`].
    Optimistic,
}

pub struct RedisStore {
    /// The server, the sentinels or the cluster (SPEC 19.3; see `redis_topology`).
    client: Topology,
    con: Option<Link>,
    /// The keys a script call declares (a cluster's: every key of the prefix).
    script_keys: Vec<String>,
    next_connect: Option<Instant>,
    script: Arc<redis::Script>,
    prefix: String,
    owner: String,
    readonly: bool,
    busy_timeout_ms: i64,
    section: Option<Section>,
    /// Stream id of the last feed entry read.
    cursor: String,
    versions: [String; TABLES.len()],
    need_leases: bool,
    leases: HashMap<i64, LeaseRow>,
    /// What the last round trips brought, for the next `pull`.
    pending: Changes,
    leases_changed: bool,
    /// Writes of the open section, as script arguments.
    args: Vec<String>,
    /// Lease writes of the open section, applied to `leases` once committed.
    lease_writes: Vec<Write>,
    /// Accounts (`key SEP platform`) of the leases an optimistic section inserts, and
    /// their tenants (`RS` and the escaped name, SPEC 23.2).
    accounts: Vec<String>,
    /// The identity of the last call that wrote (SPEC 19.2).
    write_seq: u64,
    /// A call that wrote and got no reply: sent again before anything else.
    in_doubt: Option<InDoubt>,
    /// The write lock may be ours outside a section: a `begin` whose reply was lost, or
    /// a locked section rolled back without a connection to unlock on. The next round
    /// trip drops it first (the lock names its owner), so that the fleet does not wait
    /// out its time to live.
    lock_in_doubt: bool,
    /// The last commit's retention sweep stopped at its budget.
    sweep_more: bool,
    /// Sentinel: the thread that hears the sentinels announce a new primary.
    watch: Option<Watch>,
    /// The generation of the watch's announcements last looked at.
    announced_seen: u64,
    /// The store's epoch as last seen (`P:epoch`; empty: none known, never checked).
    epoch: String,
    /// SPEC 24.4: the store lost its data; what to tell the engine (taken once).
    lost: Option<String>,
    /// The store lost its data and this engine has not written back what it knows:
    /// the epoch it lost.
    refill_from: Option<String>,
    /// A locked section's commit met a lost store: sent again as an append after the
    /// refill, and its reply read as one.
    commit_as_append: bool,
    /// The epochs whose data this engine held and wrote back (SPEC 24.4), each with
    /// the feed position it had read up to: the usage entries of their refills (any
    /// engine's) of rows up to it are counted in its windows already.
    held_epochs: Vec<(String, (u64, u64))>,
    /// Every small table as last read, with this engine's own changes: what a refill
    /// writes back.
    raw: [Vec<(String, String)>; TABLES.len()],
    /// This engine's own usage rows that retention keeps (merged per minute past the
    /// first), each with its feed entry's id (`None`: unknown): what a refill writes back.
    journal: Vec<(UsageRow, Option<(u64, u64)>)>,
    journal_compact_at: usize,
    /// Usage rows of the open section, each with the index of its write in the call
    /// (whose result is its entry's id), journaled once committed.
    section_usage: Vec<(UsageRow, usize)>,
    /// Writes (script operations) of the open section so far.
    section_ops: usize,
    /// The ids of this engine's own live leases.
    own_leases: std::collections::HashSet<i64>,
}

fn unavailable(e: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("redis: {e}"))
}

/// The connection can no longer be trusted: it failed, timed out (every read and write
/// has a timeout, set at connect from the busy timeout), or brought bytes that are no
/// reply (a cut in the middle of one): it is dropped, and the next call reconnects.
fn lost_connection(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_timeout() || e.kind() == redis::ErrorKind::ParseError
}

/// A failed exchange: a server's error reply that waiting will not cure (a key of the
/// wrong type, a script error, a command the server does not know) is
/// [`StoreError::Rejected`]; one that says the server is busy, loading, read-only,
/// out of memory or failing over is an outage, as is a transport failure. A transport
/// failure after the request was sent is [`StoreError::InDoubt`]: it may have been
/// applied.
fn store_error(e: &redis::RedisError, sent: bool) -> StoreError {
    if lost_connection(e) {
        return if sent { StoreError::InDoubt(format!("redis: no reply: {e}")) } else { unavailable(e) };
    }
    match e.code() {
        Some("ERR") if e.to_string().contains("max number of clients") => unavailable(e),
        Some("WRONGTYPE" | "ERR" | "NOPERM" | "NOSCRIPT" | "EXECABORT") => {
            StoreError::Rejected(format!("redis: {e}"))
        }
        _ => unavailable(e),
    }
}

/// The server's version from `INFO server`, refused below Redis 7.0 or Valkey 7.2
/// (SPEC 19.1: Redis 6 has no `XADD` id of the form `<ms>-*`, so every write would
/// fail).
fn check_version(info: &str) -> Result<(), String> {
    let field = |name: &str| {
        info.lines().find_map(|l| l.trim_end().strip_prefix(name).and_then(|v| v.strip_prefix(':')))
    };
    let parse = |v: &str| -> (u64, u64) {
        let mut it = v.split('.').map(|p| p.parse::<u64>().unwrap_or(0));
        (it.next().unwrap_or(0), it.next().unwrap_or(0))
    };
    let valkey = field("valkey_version")
        .or_else(|| (field("server_name") == Some("valkey")).then(|| field("redis_version")).flatten());
    let (name, version, needed) = match (valkey, field("redis_version")) {
        (Some(v), _) => ("Valkey", v, (7, 2)),
        (None, Some(v)) => ("Redis", v, (7, 0)),
        (None, None) => return Ok(()),
    };
    if parse(version) < needed {
        return Err(format!(
            "{name} {version} is too old: the Redis backend needs Redis 7.0 or later, or Valkey 7.2 or later"
        ));
    }
    Ok(())
}

/// Outside a call that writes, a lost reply is an outage like any other.
fn not_in_doubt(e: StoreError) -> StoreError {
    match e {
        StoreError::InDoubt(m) => StoreError::Unavailable(m),
        e => e,
    }
}

impl RedisStore {
    /// Connects (failing at once when the server does not answer) and checks the
    /// prefix's data is this engine's.
    pub fn open(url: &str, readonly: bool, busy_timeout_ms: i64) -> StoreResult<Self> {
        // A URL that does not parse was refused (ValueError) by `StoreSpec::check`.
        let addr = url::parse(url).map_err(StoreError::Incompatible)?;
        let prefix = addr.prefix.clone();
        if prefix.is_empty() || prefix.contains(char::is_whitespace) {
            return Err(StoreError::Incompatible(format!("bad key prefix {prefix:?} in {url:?}")));
        }
        // A cluster's keys carry the prefix as their hash tag (one slot).
        let prefix = topology::key_prefix(addr.kind, &prefix);
        if addr.kind == url::Kind::Cluster && !topology::has_hash_tag(&prefix) {
            return Err(StoreError::Incompatible(format!(
                "key prefix {:?} in {url:?} cannot be a cluster hash tag (it starts with '}}')",
                addr.prefix
            )));
        }
        let client = Topology::new(&addr, url, &prefix)?;
        let owner = format!("{:016x}", crate::core::random::random_u64());
        let script_keys = client.script_keys(&prefix, &owner, &LAYOUT.map(|(k, _)| k));
        let mut store = RedisStore {
            client,
            con: None,
            script_keys,
            next_connect: None,
            script: Arc::new(redis::Script::new(SCRIPT)),
            prefix,
            owner,
            readonly,
            busy_timeout_ms,
            section: None,
            cursor: "0-0".into(),
            versions: Default::default(),
            need_leases: true,
            leases: HashMap::new(),
            pending: Changes::default(),
            leases_changed: false,
            args: Vec::new(),
            lease_writes: Vec::new(),
            accounts: Vec::new(),
            write_seq: 0,
            in_doubt: None,
            lock_in_doubt: false,
            sweep_more: false,
            watch: None,
            announced_seen: 0,
            epoch: String::new(),
            lost: None,
            refill_from: None,
            commit_as_append: false,
            held_epochs: Vec::new(),
            raw: Default::default(),
            journal: Vec::new(),
            journal_compact_at: JOURNAL_COMPACT_MIN,
            section_usage: Vec::new(),
            section_ops: 0,
            own_leases: Default::default(),
        };
        store.connection()?;
        store.check_layout()?;
        store.watch_sentinels();
        Ok(store)
    }

    /// Sentinel: starts the thread that follows the sentinels' announcements of a new
    /// primary (see `redis_sentinel`). Without it (a thread the system refuses) the store
    /// still finds a new primary when the old one fails or refuses a write.
    fn watch_sentinels(&mut self) {
        let Some((sentinels, service)) = self.client.sentinels() else { return };
        let (connect, io) = self.timeouts();
        match Watch::start(sentinels, service, redis_sentinel::Timeouts { connect, io }) {
            Ok(w) => self.watch = Some(w),
            Err(e) => log::warn!(
                target: "quotaengine::core::store",
                "cannot start the thread that follows the sentinels' announcements: {e}"
            ),
        }
    }

    /// The connect and I/O timeouts, from the busy timeout.
    fn timeouts(&self) -> (Duration, Duration) {
        let connect = Duration::from_millis(self.busy_timeout_ms.clamp(100, 5_000) as u64);
        let io = Duration::from_millis(self.busy_timeout_ms.clamp(1_000, 30_000) as u64);
        (connect, io)
    }

    /// Sentinel: when the sentinels announced a primary other than the one connected
    /// to, the connection is left and the next one goes to it (one atomic load when
    /// nothing was announced). Only between sections: a section ends on the node it
    /// began on (a locked one holds its lock there).
    fn follow_announcement(&mut self) {
        if self.section.is_some() {
            return;
        }
        let Some(to) = self.watch.as_ref().and_then(|w| w.announced(&mut self.announced_seen)) else {
            return;
        };
        if self.client.announce(to) {
            self.con = None;
            self.next_connect = None;
        }
    }

    /// The connection to the data node; connecting asks the sentinels or the cluster
    /// where it is (SPEC 19.3: at open and after a failed connection, never per call).
    fn connection(&mut self) -> StoreResult<&mut Link> {
        self.follow_announcement();
        if self.con.is_none() {
            if self.next_connect.is_some_and(|t| Instant::now() < t) {
                return Err(unavailable("server did not answer (retrying shortly)"));
            }
            let (timeout, io) = self.timeouts();
            match self.client.connect(timeout, io) {
                Ok(con) => {
                    self.con = Some(con);
                    self.next_connect = None;
                    // A new connection may reach a server that lost our state (a restart
                    // without persistence): read everything afresh.
                    self.resync();
                    self.establish_epoch();
                }
                Err(e) => {
                    self.next_connect = Some(Instant::now() + RECONNECT_PAUSE);
                    return Err(unavailable(e));
                }
            }
        }
        self.con.as_mut().ok_or_else(|| unavailable("not connected"))
    }

    /// Forgets what was read, so that the next read brings all the small tables and
    /// the leases again.
    fn resync(&mut self) {
        self.versions = Default::default();
        self.need_leases = true;
    }

    /// Drops what a failed read half took in, and reads everything afresh next time.
    /// The usage already taken in stays: it is what lies before the cursor.
    fn forget(&mut self) {
        self.pending = Changes { usage: std::mem::take(&mut self.pending.usage), ..Changes::default() };
        self.resync();
    }

    /// One round trip on the connection; a failed connection is dropped so the next
    /// call reconnects. A transport failure after the request went out is
    /// [`StoreError::InDoubt`] (see [`store_error`]).
    fn round_trip(&mut self, f: impl FnOnce(&mut Link) -> redis::RedisResult<Value>) -> StoreResult<Value> {
        let con = self.connection()?;
        f(con).map_err(|e| {
            // A node that is no longer the primary is left: the sentinels are asked again.
            if lost_connection(&e) || topology::must_reconnect(&e) {
                self.con = None;
                if topology::pause_reconnect(&e) {
                    self.next_connect = Some(Instant::now() + RECONNECT_PAUSE);
                }
            }
            store_error(&e, true)
        })
    }

    /// A command that writes nothing: a lost reply is only an outage.
    fn query(&mut self, cmd: &redis::Cmd) -> StoreResult<Value> {
        self.round_trip(|con| cmd.query(con)).map_err(not_in_doubt)
    }

    /// At open (one round trip): the server is recent enough, and every key this
    /// engine keeps under the prefix holds the type it keeps there (SPEC 19.1).
    fn check_layout(&mut self) -> StoreResult<()> {
        let mut pipe = redis::pipe();
        pipe.cmd("INFO").arg("server");
        for (key, _) in LAYOUT {
            pipe.cmd("TYPE").arg(format!("{}:{key}", self.prefix));
        }
        let reply = self.round_trip(|con| pipe.query(con)).map_err(not_in_doubt)?;
        let replies = array(&reply)?;
        let info = replies.first().map(text).transpose()?.unwrap_or_default();
        check_version(&info).map_err(StoreError::Incompatible)?;
        for ((key, want), got) in LAYOUT.iter().zip(&replies[1..]) {
            let got = text(got)?;
            if got != "none" && got != *want {
                return Err(StoreError::Incompatible(format!(
                    "key {}:{key} holds a {got}, not this engine's data (a {want}): pick another ?prefix=",
                    self.prefix
                )));
            }
        }
        self.establish_epoch();
        Ok(())
    }

    /// SPEC 24.4: the store's identity, set by the first engine that opens the prefix.
    /// A server that takes no writes (a replica) leaves it unset, as does a failure:
    /// tried again at the next connection; meanwhile this engine checks nothing (nor
    /// does a read-only one, ever).
    fn establish_epoch(&mut self) {
        if self.readonly || !self.epoch.is_empty() {
            return;
        }
        let key = format!("{}:epoch", self.prefix);
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(format!("{:016x}", crate::core::random::random_u64())).arg("NX");
        let mut get = redis::cmd("GET");
        get.arg(&key);
        // On the link itself: a refusal (a replica's READONLY) must not drop it.
        let Some(con) = self.con.as_mut() else { return };
        if set.query::<Value>(con).is_ok() {
            self.epoch = get.query::<Value>(con).ok().and_then(|v| text(&v).ok()).unwrap_or_default();
        }
    }

    fn invoke(&mut self, mode: &str, writes: &[String]) -> StoreResult<Value> {
        self.invoke_with(mode, "", &[], writes).map_err(not_in_doubt)
    }

    /// `id` is the call's identity when it writes (else empty). `extra` goes between
    /// the fixed arguments and the writes (mode `lease`: the count of accounts, then
    /// the accounts).
    fn invoke_with(
        &mut self, mode: &str, id: &str, extra: &[String], writes: &[String],
    ) -> StoreResult<Value> {
        let script = Arc::clone(&self.script);
        let mut inv = redis::cmd("EVALSHA");
        inv.arg(script.get_hash())
            .arg(self.script_keys.len())
            .arg(&self.script_keys)
            .arg(&self.prefix)
            .arg(mode)
            .arg(&self.owner)
            .arg(LOCK_TTL_MS)
            .arg(&self.cursor)
            .arg(MAX_ENTRIES)
            .arg(if self.need_leases { "1" } else { "0" })
            .arg(id)
            .arg(&self.epoch);
        for v in &self.versions {
            inv.arg(v);
        }
        for w in extra.iter().chain(writes) {
            inv.arg(w);
        }
        // With ?wait_replicas=, a call that writes is followed by WAIT in the same
        // pipeline; a write too few replicas hold is in doubt: kept and sent again.
        let writes = !id.is_empty();
        let result = self.round_trip(|con| con.eval(&script, &inv, writes));
        let unconfirmed = self.con.as_mut().and_then(Link::take_unconfirmed);
        if let Some(short) = self.con.as_ref().map(Link::short) {
            self.client.carry_short(short);
            if short && self.client.kind() == url::Kind::Sentinel {
                // A primary without the replicas ?wait_replicas= asks for may have been
                // failed over (a demoted primary takes writes until the sentinels
                // reconfigure it): the sentinels are asked again, after a pause.
                self.con = None;
                self.next_connect = Some(Instant::now() + RECONNECT_PAUSE);
            }
        }
        let reply = result?;
        if let Some(msg) = unconfirmed {
            // Only a call the script applied (status `ok`; not `busy`, not `conflict`).
            let applied = matches!(&reply, Value::Array(p) if p.first().and_then(|s| text(s).ok()).as_deref() == Some("ok"));
            if writes && applied {
                return Err(StoreError::InDoubt(msg));
            }
        }
        Ok(reply)
    }

    /// Calls the script, waiting (up to the busy timeout) while another engine holds
    /// the lock. Returns the reply (status `ok`, or `conflict` in mode `lease`).
    fn call(&mut self, mode: &str, writes: &[String]) -> StoreResult<Vec<Value>> {
        self.call_with(mode, &[], writes)
    }

    /// A call that writes gets the next identity; when its reply is lost the store
    /// keeps its writes to send again ([`StoreError::InDoubt`]). Anything a call
    /// before it left in doubt is sent first.
    fn call_with(&mut self, mode: &str, extra: &[String], writes: &[String]) -> StoreResult<Vec<Value>> {
        self.settle()?;
        if !matches!(mode, "append" | "lease" | "commit") {
            let sent = self.send(mode, "", extra, writes);
            if mode == "begin" && matches!(sent, Err(StoreError::InDoubt(_))) {
                // The server may have taken the lock for us: dropped at the next call.
                self.lock_in_doubt = true;
            }
            return sent.map_err(not_in_doubt);
        }
        self.write_seq += 1;
        let id = self.write_seq;
        let sent = self.send(mode, &id.to_string(), extra, writes);
        if let Err(StoreError::InDoubt(_)) = &sent {
            // What an optimistic section decided stands (as when degraded): it is sent
            // again without the conflict check.
            self.in_doubt = Some(InDoubt { id, writes: writes.to_vec(), usage: Vec::new() });
        }
        sent
    }

    /// Sends again the writes of a call whose reply was lost, under its identity
    /// (the server skips them if it had applied them), and takes in what changed; drops
    /// the write lock when a lost reply may have left it ours (`replay` drops it too).
    /// While that fails, so does every call.
    fn settle(&mut self) -> StoreResult<()> {
        self.refill()?;
        if let Some(mut d) = self.in_doubt.take() {
            match self.send("replay", &d.id.to_string(), &[], &d.writes) {
                Ok(parts) => {
                    self.lock_in_doubt = false;
                    self.journal_rows(std::mem::take(&mut d.usage).into_iter().map(|u| (u, None)).collect());
                    self.absorb(&parts).and_then(|more| self.drain(more)).inspect_err(|_| self.forget())?;
                }
                Err(e) => {
                    self.in_doubt = Some(d);
                    return Err(not_in_doubt(e));
                }
            }
        }
        if self.lock_in_doubt {
            self.invoke("unlock", &[])?;
            self.lock_in_doubt = false;
        }
        Ok(())
    }

    /// Invokes the script, waiting (up to the busy timeout) while another engine
    /// holds the lock.
    fn send(&mut self, mode: &str, id: &str, extra: &[String], writes: &[String]) -> StoreResult<Vec<Value>> {
        let deadline = Instant::now() + Duration::from_millis(self.busy_timeout_ms.max(0) as u64);
        let mut pause = Duration::from_micros(50);
        let mut mode = mode;
        let mut refilled = false;
        loop {
            let parts = match self.invoke_with(mode, id, extra, writes)? {
                Value::Array(parts) => parts,
                other => return Err(self.desynchronised(&format!("{other:?}"))),
            };
            let status = match parts.first().map(text) {
                Some(Ok(s)) => s,
                _ => return Err(self.desynchronised("a reply without a status")),
            };
            // A status with fewer parts than the script's replies carry is another
            // reply's bytes.
            match status.as_str() {
                "ok" | "conflict" if parts.len() >= 8 => return Ok(parts),
                "busy" if parts.len() >= 2 => {
                    let now = Instant::now();
                    if now >= deadline {
                        return Err(unavailable("locked by another engine past the busy timeout"));
                    }
                    std::thread::sleep(pause.min(deadline - now));
                    pause = (pause * 2).min(Duration::from_millis(2));
                }
                "lost" if parts.len() >= 2 => {
                    let lost = self.found_lost(parts.get(1));
                    if refilled || mode == "refill" {
                        return Err(lost);
                    }
                    // SPEC 24.4: what this engine knows goes back first (when that
                    // fails the call fails: the engine is degraded until it is written).
                    self.refill()?;
                    refilled = true;
                    if mode == "commit" {
                        // The lock went with the data: others may have written since;
                        // the writes (decided under the lock) are appended after them.
                        mode = "append";
                        self.commit_as_append = true;
                    }
                    // Sent again in the new epoch: a decision (mode `lease`) conflicts, as
                    // everything is read afresh, and is made again on what the store holds.
                }
                other => {
                    return Err(self.desynchronised(&format!("status {other:?} in {} parts", parts.len())))
                }
            }
        }
    }

    /// A reply that is not the script's answer to this call (bytes of another reply
    /// read as this one): the connection is out of step and dropped, and the call may
    /// have been applied (in doubt, sent again under its identity).
    fn desynchronised(&mut self, what: &str) -> StoreError {
        self.con = None;
        StoreError::InDoubt(format!("redis: unexpected script reply ({what}); the connection is dropped"))
    }

    /// SPEC 24.4: the script found the store's epoch gone or changed: the store lost
    /// what this engine saw in it. Nothing was read or written; what this engine knows
    /// is to be written back (`refill`) before anything else.
    fn found_lost(&mut self, now: Option<&Value>) -> StoreError {
        let now = now.and_then(|v| text(v).ok()).unwrap_or_default();
        let was = &self.epoch;
        let msg = if now.is_empty() {
            format!("the Redis store lost its data (its epoch {was} is gone: a restart without persistence, or a flush)")
        } else {
            format!("the Redis store lost its data (its epoch changed from {was} to {now}: flushed, or another server)")
        };
        if self.refill_from.is_none() {
            self.refill_from = Some(self.epoch.clone());
            self.lost = Some(msg.clone());
        }
        unavailable(msg)
    }

    /// SPEC 24.4: writes back what this engine knows of a store that lost its data, in
    /// one call: every small table as last read (each item only where absent), its own
    /// live leases and its own usage rows that retention keeps; then takes the store's
    /// new epoch and reads everything afresh. Applied once per engine and lost epoch
    /// (`P:refilled`), so a refill whose reply was lost is sent again safely; a call
    /// left in doubt is sent again after it, under its own identity.
    fn refill(&mut self) -> StoreResult<()> {
        let Some(lost) = self.refill_from.clone() else { return Ok(()) };
        let mut writes = Vec::new();
        // First (their results are their new ids): the usage, each row named by the id
        // it had, so that an engine that had read it skips it.
        for (u, id) in &self.journal {
            let id = id.map_or_else(String::new, |(ms, seq)| format!("{ms}-{seq}"));
            let mut one = Vec::with_capacity(3);
            codec::encode(&Write::Usage(u.clone()), &mut one);
            let [_, created, entry] = <[String; 3]>::try_from(one).unwrap_or_default();
            writes.extend(["RU".to_string(), created, id, entry]);
        }
        for (t, rows) in TABLES.iter().zip(&self.raw) {
            for (f, v) in rows {
                writes.extend(["N".to_string(), (*t).to_string(), f.clone(), v.clone()]);
            }
        }
        let mut own: Vec<&LeaseRow> = self.own_leases.iter().filter_map(|id| self.leases.get(id)).collect();
        own.sort_by_key(|l| l.id);
        for l in own {
            codec::encode(&Write::InsertLease(l.clone()), &mut writes);
        }
        // The epoch the store takes if this is the first refill (the script checks
        // none in this mode).
        self.epoch = format!("{:016x}", crate::core::random::random_u64());
        let parts = self.send("refill", "", std::slice::from_ref(&lost), &writes).map_err(not_in_doubt)?;
        let epoch = parts.get(6).ok_or_else(|| unavailable("short script reply"))?;
        self.epoch = text(epoch)?;
        self.refill_from = None;
        // The rows' ids in the new epoch (unknown when this refill had been applied
        // already, its reply lost: such a row is then never skipped by others).
        let ids = match parts.get(7) {
            Some(Value::Array(results)) => {
                results.iter().map(|v| text(v).ok().map(|s| stream_id(&s))).collect()
            }
            _ => Vec::new(),
        };
        for (i, (_, id)) in self.journal.iter_mut().enumerate() {
            *id = ids.get(i).copied().flatten();
        }
        let read_to = stream_id(&self.cursor);
        self.held_epochs.retain(|(e, _)| *e != lost);
        self.held_epochs.push((lost, read_to));
        // Every entry of the feed now was written since the loss: read from its start
        // (the refills of what this engine held are skipped, its windows count them
        // already), and every table and lease afresh. The usage taken in before stays.
        self.cursor = "0-0".into();
        self.forget();
        Ok(())
    }

    /// After a commit that wrote usage rows: they are this engine's own, kept for a
    /// refill while retention keeps them (merged per minute past the first).
    fn journal_rows(&mut self, mut rows: Vec<(UsageRow, Option<(u64, u64)>)>) {
        if rows.is_empty() {
            return;
        }
        self.journal.append(&mut rows);
        if self.journal.len() < self.journal_compact_at {
            return;
        }
        let newest = self.journal.iter().map(|(u, _)| u.created_at_ms).max().unwrap_or(0);
        let horizon = newest.saturating_sub(crate::core::clock::MINUTE_MS);
        let mut merged: HashMap<super::UsageMergeKey, usize> = HashMap::new();
        let mut out: Vec<(UsageRow, Option<(u64, u64)>)> = Vec::with_capacity(self.journal.len());
        for (u, id) in self.journal.drain(..) {
            if u.created_at_ms > horizon {
                out.push((u, id));
                continue;
            }
            let key = u.merge_key();
            match merged.get(&key) {
                Some(&i) => {
                    let (m, mid) = &mut out[i];
                    // Skipped by another engine only if it had read every row merged.
                    *mid = mid.zip(id).map(|(a, b)| a.max(b));
                    m.absorb(&u);
                }
                None => {
                    merged.insert(key, out.len());
                    out.push((u, id));
                }
            }
        }
        self.journal = out;
        self.journal_compact_at = (self.journal.len() * 2).max(JOURNAL_COMPACT_MIN);
    }

    /// SPEC 24.4: a usage entry written back after a loss (`~epoch:id:owner`) of a row
    /// this engine wrote, or had read before the loss (an epoch it held, an id up to
    /// where it had read): its windows count it already.
    fn counted_refill(&self, who: &str) -> bool {
        let mut parts = who.strip_prefix('~').unwrap_or_default().splitn(3, ':');
        let (Some(epoch), Some(id), Some(by)) = (parts.next(), parts.next(), parts.next()) else {
            return false;
        };
        let held = |e: &String| e == epoch;
        by == self.owner
            || (!id.is_empty()
                && self.held_epochs.iter().any(|(e, read_to)| held(e) && stream_id(id) <= *read_to))
    }

    /// Takes in what a script reply says changed: `{status, head, more, entries,
    /// versions, tables, leases, results}`. Returns `more`.
    fn absorb(&mut self, parts: &[Value]) -> StoreResult<bool> {
        let [_, head, more, entries, versions, tables, leases, _] = parts else {
            return Err(unavailable("short script reply"));
        };
        // The usage read and the cursor move together: what `pending` holds is always
        // exactly what lies before the cursor (a failure here takes in neither).
        let head = text(head)?;
        let mut usage = Vec::new();
        for e in array(entries)? {
            let e = text(e)?;
            let Some((who, body)) = e.split_once(SEP) else { continue };
            if who == self.owner {
                continue;
            }
            if body.starts_with('U') {
                // SPEC 24.4: usage written back for an epoch this engine held is in its
                // windows already.
                if self.counted_refill(who) {
                    continue;
                }
                usage.push(parse_usage(body)?);
            } else {
                self.lease_entry(body)?;
            }
        }
        self.pending.usage.append(&mut usage);
        self.cursor = head;
        let versions = array(versions)?;
        let tables = array(tables)?;
        for (i, t) in tables.iter().enumerate().take(TABLES.len()) {
            if matches!(t, Value::Nil | Value::Boolean(false)) {
                continue;
            }
            let rows = pairs(t)?;
            self.raw[i] = rows.clone();
            codec::take_table(i, rows, &mut self.pending)?;
            if let Some(v) = versions.get(i) {
                self.versions[i] = text(v)?;
            }
        }
        if !matches!(leases, Value::Nil | Value::Boolean(false)) {
            self.leases.clear();
            for (id, v) in pairs(leases)? {
                let id = parse_i64(&id)?;
                self.leases.insert(id, parse_lease(id, &v)?);
            }
            self.need_leases = false;
            self.leases_changed = true;
        }
        Ok(int(more)? != 0)
    }

    /// Reads the rest of the feed when a reply said there was more.
    fn drain(&mut self, mut more: bool) -> StoreResult<()> {
        while more {
            let parts = self.call("read", &[])?;
            more = self.absorb(&parts)?;
        }
        Ok(())
    }

    /// After a locked section's commit: the feed's head and the table versions,
    /// which only our own writes changed.
    fn follow_own_commit(&mut self, parts: &[Value]) -> StoreResult<()> {
        let [_, head, _, _, versions, tables, ..] = parts else {
            return Err(unavailable("short script reply"));
        };
        self.cursor = text(head)?;
        // The tables our writes changed, whole: kept for a refill (SPEC 24.4) only.
        for (i, t) in array(tables)?.iter().enumerate().take(TABLES.len()) {
            if !matches!(t, Value::Nil | Value::Boolean(false)) {
                self.raw[i] = pairs(t)?;
            }
        }
        for (i, v) in array(versions)?.iter().enumerate().take(TABLES.len()) {
            self.versions[i] = text(v)?;
        }
        Ok(())
    }

    /// Opens a write section that reads nothing first (its one round trip is at commit).
    fn open_unlocked(&mut self, section: Section) -> StoreResult<()> {
        if self.readonly {
            return Err(StoreError::ReadOnly);
        }
        if self.section.is_some() {
            self.rollback();
        }
        // Checked here so that a dead server degrades the engine before it decides;
        // what a lost reply left in doubt goes first.
        self.connection()?;
        self.settle()?;
        self.section = Some(section);
        Ok(())
    }

    /// After a commit: our own lease writes, which the feed will not bring back to us.
    fn apply_own_leases(&mut self) {
        for w in std::mem::take(&mut self.lease_writes) {
            match w {
                Write::InsertLease(l) => {
                    self.own_leases.insert(l.id);
                    self.leases.insert(l.id, l);
                }
                Write::DeleteLease(id) => {
                    self.own_leases.remove(&id);
                    self.leases.remove(&id);
                }
                Write::Sweep { leases_expired_before, .. } => {
                    self.leases.retain(|_, l| l.expires_at_ms >= leases_expired_before);
                    let leases = &self.leases;
                    self.own_leases.retain(|id| leases.contains_key(id));
                }
                _ => {}
            }
        }
    }

    /// Feed entries (all writers) with ids from `start`, page by page: `(id, writer,
    /// body)`. Returns the last id read (empty when none).
    fn scan(
        &mut self, start: String, mut each: impl FnMut(&str, &str, &str) -> StoreResult<()>,
    ) -> StoreResult<String> {
        let mut from = start;
        let mut last = String::new();
        loop {
            let mut cmd = redis::cmd("XRANGE");
            cmd.arg(format!("{}:log", self.prefix)).arg(&from).arg("+").arg("COUNT").arg(MAX_ENTRIES);
            let reply = self.query(&cmd)?;
            let rows = array(&reply)?;
            for e in rows {
                let e = array(e)?;
                let (Some(id), Some(fields)) = (e.first(), e.get(1)) else { continue };
                last = text(id)?;
                let fields = array(fields)?;
                let Some(data) = fields.get(1) else { continue };
                let data = text(data)?;
                let Some((who, body)) = data.split_once(SEP) else { continue };
                each(&last, who, body)?;
            }
            if rows.len() < MAX_ENTRIES {
                return Ok(last);
            }
            from = format!("({last}");
        }
    }

    /// In an optimistic section: the commit conflicts when another engine wrote usage or
    /// a lease for one of these tenants meanwhile (SPEC 23.2), as for an account.
    fn watch_tenants(&mut self, tenants: &[Arc<str>]) {
        if self.section != Some(Section::Optimistic) {
            return;
        }
        for t in tenants {
            let watch = codec::tenant_watch(t);
            if !self.accounts.contains(&watch) {
                self.accounts.push(watch);
            }
        }
    }

    /// Applies a lease entry of the feed (`L id value` or `D id`) of another writer.
    fn lease_entry(&mut self, body: &str) -> StoreResult<()> {
        match body.as_bytes().first() {
            Some(b'L') => {
                let (id, v) = body[2..].split_once(SEP).unwrap_or(("", ""));
                let id = parse_i64(id)?;
                self.leases.insert(id, parse_lease(id, v)?);
                self.leases_changed = true;
            }
            Some(b'D') => {
                let id = parse_i64(&body[2..])?;
                self.leases.remove(&id);
                self.leases_changed = true;
            }
            _ => {}
        }
        Ok(())
    }
}

/// A stream id as numbers, for ordering.
fn stream_id(s: &str) -> (u64, u64) {
    let (ms, seq) = s.split_once('-').unwrap_or((s, "0"));
    (ms.parse().unwrap_or(0), seq.parse().unwrap_or(0))
}

impl Store for RedisStore {
    fn readonly(&self) -> bool {
        self.readonly
    }

    fn changed(&mut self) -> StoreResult<bool> {
        // Knowing would cost the same round trip as reading.
        Ok(true)
    }

    fn begin(&mut self, write: bool) -> StoreResult<()> {
        if write && self.readonly {
            return Err(StoreError::ReadOnly);
        }
        if self.section.is_some() {
            self.rollback();
        }
        let parts = self.call(if write { "begin" } else { "read" }, &[])?;
        self.section = Some(if write { Section::Write } else { Section::Read });
        let more = self.absorb(&parts);
        match more.and_then(|more| self.drain(more)) {
            Ok(()) => Ok(()),
            Err(e) => {
                self.rollback();
                Err(e)
            }
        }
    }

    fn begin_append(&mut self) -> StoreResult<()> {
        self.open_unlocked(Section::Append)
    }

    fn begin_optimistic(&mut self) -> StoreResult<bool> {
        self.open_unlocked(Section::Optimistic).map(|()| true)
    }

    fn commit(&mut self) -> StoreResult<()> {
        let Some(section) = self.section else { return Ok(()) };
        self.commit_as_append = false;
        let args = std::mem::take(&mut self.args);
        let accounts = std::mem::take(&mut self.accounts);
        let result = match section {
            Section::Read => Ok(None),
            Section::Write => self.call("commit", &args).map(Some),
            Section::Append | Section::Optimistic if args.is_empty() => Ok(None),
            Section::Optimistic if !accounts.is_empty() => {
                let mut extra = Vec::with_capacity(accounts.len() + 1);
                extra.push(accounts.len().to_string());
                extra.extend(accounts);
                self.call_with("lease", &extra, &args).map(Some)
            }
            Section::Append | Section::Optimistic => self.call("append", &args).map(Some),
        };
        let reply = match result {
            Ok(reply) => reply,
            Err(e) => {
                if matches!(e, StoreError::InDoubt(_)) {
                    // The writes will be applied (once): for the engine they are.
                    self.apply_own_leases();
                    let usage = std::mem::take(&mut self.section_usage);
                    if let Some(d) = self.in_doubt.as_mut() {
                        d.usage = usage.into_iter().map(|(u, _)| u).collect();
                    }
                }
                self.rollback();
                self.forget();
                return Err(e);
            }
        };
        self.section = None;
        let conflict =
            matches!(reply.as_deref().and_then(|p| p.first()).map(text), Some(Ok(s)) if s == "conflict");
        let usage = std::mem::take(&mut self.section_usage);
        self.section_ops = 0;
        if !conflict {
            // Each row with its entry's id, the result of its write.
            let results = match reply.as_deref() {
                Some([.., Value::Array(results)]) => results.as_slice(),
                _ => &[],
            };
            let id = |i: usize| results.get(i).and_then(|v| text(v).ok()).filter(|s| s.contains('-'));
            let rows = usage.into_iter().map(|(u, i)| (u, id(i).map(|s| stream_id(&s)))).collect();
            self.journal_rows(rows);
        }
        // The sweep's result is 'more' when it stopped at its budget (every other
        // write's result is a number).
        if let Some([.., Value::Array(results)]) = reply.as_deref() {
            self.sweep_more |= results.iter().any(|v| matches!(text(v).as_deref(), Ok("more")));
        }
        let taken = match reply {
            None => Ok(()),
            // Only our own writes happened since `begin`: follow on after them.
            Some(parts) if section == Section::Write && !std::mem::take(&mut self.commit_as_append) => {
                self.follow_own_commit(&parts)
            }
            // What others wrote before our entries (ours are skipped when read); after
            // a conflict, what changed, for the next pull (nothing was written).
            Some(parts) => self.absorb(&parts).and_then(|more| self.drain(more)),
        };
        if let Err(e) = taken {
            self.forget();
            if conflict {
                self.lease_writes.clear();
                return Err(e);
            }
            // SPEC 19.2: the writes were applied; only reading what others wrote since
            // failed. They are not to be sent again: for the engine they are committed,
            // and it is degraded until the store answers.
            self.apply_own_leases();
            return Err(StoreError::InDoubt(format!("{e} (after the writes were applied)")));
        }
        if conflict {
            self.lease_writes.clear();
            return Err(StoreError::Conflict);
        }
        self.apply_own_leases();
        Ok(())
    }

    fn rollback(&mut self) {
        if self.section == Some(Section::Write) {
            // Without a connection (or an answer) the lock stays ours until the next
            // call drops it (`settle`).
            self.lock_in_doubt = self.con.is_none() || self.invoke("unlock", &[]).is_err();
        }
        // A section that reads nothing before its commit has nothing half-read to
        // forget (a failed commit forgets it there).
        let read = !matches!(self.section, Some(Section::Append | Section::Optimistic));
        self.section = None;
        self.args.clear();
        self.lease_writes.clear();
        self.accounts.clear();
        self.section_usage.clear();
        self.section_ops = 0;
        if read {
            self.forget();
        }
    }

    fn pull(&mut self) -> StoreResult<Changes> {
        let mut ch = std::mem::take(&mut self.pending);
        if self.leases_changed {
            ch.leases = Some(self.leases.values().cloned().collect());
            self.leases_changed = false;
        }
        Ok(ch)
    }

    fn load_usage_since(&mut self, since_ms: i64, f: &mut dyn FnMut(UsageRow)) -> StoreResult<()> {
        let mut lease_entries = Vec::new();
        let seen = stream_id(&self.cursor);
        let owner = self.owner.clone();
        let last = self.scan(since_ms.max(0).to_string(), |id, who, body| {
            if body.starts_with('U') {
                let u = parse_usage(body)?;
                if u.created_at_ms >= since_ms {
                    f(u);
                }
            } else if who != owner && stream_id(id) > seen {
                lease_entries.push(body.to_string());
            }
            Ok(())
        })?;
        // The rows just loaded include what the section's read brought; lease entries
        // past that read still count.
        self.pending.usage.clear();
        for body in lease_entries {
            self.lease_entry(&body)?;
        }
        if !last.is_empty() && stream_id(&last) > seen {
            self.cursor = last;
        }
        Ok(())
    }

    fn watch_keys(&mut self, platform: &str, keys: &[i64]) {
        if self.section != Some(Section::Optimistic) {
            return;
        }
        for k in keys {
            let account = codec::account(*k, platform);
            if !self.accounts.contains(&account) {
                self.accounts.push(account);
            }
        }
    }

    fn write(&mut self, w: &Write) -> StoreResult<i64> {
        if self.readonly {
            return Err(StoreError::ReadOnly);
        }
        codec::encode(w, &mut self.args);
        // The script's operations (one per write but a renewal's, one per lease).
        self.section_ops += match w {
            Write::RenewLeases(rows) => rows.len(),
            _ => 1,
        };
        // Lease writes are applied to `leases` once committed; an inserted lease's
        // account and tenants are what an optimistic commit checks.
        match w {
            Write::InsertLease(l) => {
                self.watch_keys(&l.platform, &[l.key_id]);
                self.watch_tenants(&l.tenants);
                self.lease_writes.push(w.clone());
                Ok(l.id)
            }
            Write::DeleteLease(_) => {
                self.lease_writes.push(w.clone());
                Ok(0)
            }
            Write::Sweep { usage_before, kept, .. } => {
                // What retention deletes from the store is not written back either.
                self.journal.retain(|(u, _)| {
                    u.created_at_ms
                        >= super::usage_cutoff(kept, *usage_before, &u.platform, &u.model_id, &u.tenants)
                });
                self.lease_writes.push(w.clone());
                Ok(0)
            }
            Write::RenewLeases(rows) => {
                self.lease_writes.extend(rows.iter().cloned().map(Write::InsertLease));
                Ok(0)
            }
            Write::Usage(u) => {
                self.section_usage.push((u.clone(), self.section_ops - 1));
                Ok(0)
            }
            _ => Ok(0),
        }
    }

    fn set_busy_timeout(&mut self, ms: i64) {
        self.busy_timeout_ms = ms;
    }

    fn sweep_unfinished(&mut self) -> bool {
        std::mem::take(&mut self.sweep_more)
    }

    fn undelivered(&self) -> usize {
        self.in_doubt.as_ref().map_or(0, |d| d.writes.len())
    }

    fn take_lost(&mut self) -> Option<String> {
        self.lost.take()
    }

    fn after_fork(&mut self) -> bool {
        // The socket (and its TLS session) is the parent's: neither written nor
        // closed here. The child connects anew, under an owner id of its own.
        if let Some(c) = self.con.take() {
            std::mem::forget(c);
        }
        // The sentinels' listener is a thread of the parent's, not in this process.
        if let Some(w) = self.watch.take() {
            w.forget();
        }
        self.readonly = true;
        false
    }

    fn try_claim(&mut self, name: &str, ttl_ms: i64) -> StoreResult<bool> {
        let key = format!("{}:claim:{name}", self.prefix);
        let mut set = redis::cmd("SET");
        set.arg(&key).arg(&self.owner).arg("NX").arg("PX").arg(ttl_ms.max(1));
        if !matches!(self.query(&set)?, Value::Nil) {
            return Ok(true);
        }
        let mut get = redis::cmd("GET");
        get.arg(&key);
        Ok(text(&self.query(&get)?).is_ok_and(|holder| holder == self.owner))
    }

    fn usage_events(&mut self, f: &UsageFilter) -> StoreResult<Vec<UsageRow>> {
        let start = f.since_ms.map_or_else(|| "-".to_string(), |s| s.max(0).to_string());
        let mut out = Vec::new();
        self.scan(start, |_, _, body| {
            if !body.starts_with('U') {
                return Ok(());
            }
            let u = parse_usage(body)?;
            let keep = f.since_ms.is_none_or(|s| u.created_at_ms >= s)
                && f.until_ms.is_none_or(|s| u.created_at_ms < s)
                && f.platform.as_deref().is_none_or(|p| *u.platform == *p)
                && f.model_id.as_deref().is_none_or(|m| *u.model_id == *m)
                && f.key_id.is_none_or(|k| u.key_id == k);
            if keep {
                // One row per request, as in the SQLite table.
                out.extend(u.one_per_event());
            }
            Ok(())
        })?;
        out.sort_by_key(|u| u.created_at_ms);
        Ok(out)
    }

    fn quota_states(&mut self, platform: Option<&str>) -> StoreResult<Vec<QuotaStateRow>> {
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(format!("{}:quota", self.prefix));
        let reply = self.query(&cmd)?;
        let mut out = Vec::new();
        for (f, v) in pairs(&reply)? {
            let row = parse_quota(&f, &v)?;
            if platform.is_none_or(|p| p == row.platform) {
                out.push(row);
            }
        }
        out.sort_by(|a, b| {
            (&a.platform, a.key_id, &a.pool_key, &a.metric).cmp(&(
                &b.platform,
                b.key_id,
                &b.pool_key,
                &b.metric,
            ))
        });
        Ok(out)
    }

    fn server_logs(&mut self, limit: i64) -> StoreResult<Vec<(i64, LogRow, Option<String>)>> {
        let mut cmd = redis::cmd("XREVRANGE");
        cmd.arg(format!("{}:logs", self.prefix)).arg("+").arg("-").arg("COUNT").arg(limit.max(0));
        let reply = self.query(&cmd)?;
        let mut out = Vec::new();
        for e in array(&reply)? {
            let e = array(e)?;
            let Some(fields) = e.get(1) else { continue };
            let Some(data) = array(fields)?.get(1) else { continue };
            out.push(parse_log(&text(data)?)?);
        }
        out.sort_by_key(|r| std::cmp::Reverse((r.1.created_at_ms, r.0)));
        Ok(out)
    }
}

#[cfg(test)]
mod tests;
