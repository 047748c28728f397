//! Where the Redis backend's data lives (SPEC 19.3): one server (`redis://`), the
//! primary that a set of sentinels names (`redis+sentinel://`), or the cluster node
//! that owns the prefix's hash slot (`redis+cluster://`); `rediss+` for TLS.
//!
//! Whatever the topology, the store talks to ONE data node over one connection, so a
//! call stays one round trip (a script, or a pipeline of the script and `WAIT`):
//! * Sentinel: the sentinels are asked for the primary of the service at open and
//!   whenever a connection to the primary fails (never per call); the node named is
//!   checked with `ROLE` (a sentinel may still name a demoted primary). A node that
//!   answers `READONLY` or `MASTERDOWN` is left, and the sentinels asked again. A
//!   primary the sentinels announced (`+switch-master`, heard by the store's thread in
//!   `redis_sentinel`) is connected to first, when it says it is one.
//! * Cluster: every key of a prefix is in one hash slot: the keys are named
//!   `{prefix}:...` (the prefix is the hash tag; a prefix that already holds a hash
//!   tag is kept as it is), where a single server or Sentinel keeps `prefix:...`, so
//!   that data written before opens unchanged. The node owning that slot is found
//!   with `CLUSTER SLOTS`, asked of the last owner, then of every node (primaries and
//!   replicas) the last answer named, then of the URL's nodes: after a failover the
//!   promoted replica is found even when the URL named only the node that died. A
//!   `MOVED` reply moves the connection to the node it names and sends again, an `ASK`
//!   reply sends once to the node it names after `ASKING`; a node that answers
//!   `CLUSTERDOWN` (it knows no node serving the slot) is left and the owner asked
//!   again, after a pause.
//!   The script declares every key it touches, so that during a resharding the server
//!   itself refuses (`TRYAGAIN`, an outage) a call whose keys are split between nodes.
//! * `?wait_replicas=N`: a call that writes is followed, in the same pipeline, by
//!   `WAIT N timeout`; a write fewer than N replicas acknowledged, or whose `WAIT`
//!   failed (a primary demoted while it waited ends it with `UNBLOCKED`), is reported
//!   in doubt (the store keeps it and sends it again, applied once, SPEC 19.2). Until it is
//!   confirmed the primary's replicas are counted with `ROLE` before a write is sent
//!   again, so that a primary without replicas costs no `WAIT` timeout per call. On
//!   Sentinel a primary whose replicas fell short counts as a failed connection: the
//!   sentinels are asked again (after a pause), since a primary demoted by a failover
//!   keeps taking writes until the sentinels reconfigure it.
//!
//! The crate's own `sentinel` and `cluster` clients are not used: the sync sentinel
//! client connects to sentinels and candidate primaries without a timeout, and the
//! sync cluster connection retries with backoff inside a call and routes `WAIT` to
//! every primary rather than to the node that took the write.
use super::redis::url::{host_port, Address, Kind, Wait};
use crate::core::error::StoreError;
use redis::{
    ConnectionAddr, ConnectionInfo, ConnectionLike, ErrorKind, RedisConnectionInfo, RedisError, Value,
};
use std::time::{Duration, Instant};

/// How long a store whose `WAIT` fell short leaves its primary alone before counting
/// its replicas again.
const WAIT_RETRY_PAUSE: Duration = Duration::from_millis(100);
/// Redirections followed within one call before giving up (an outage).
const MAX_REDIRECTS: usize = 5;
const CLUSTER_SLOTS: u16 = 16384;

/// Redis Cluster's CRC16 (XMODEM).
fn crc16(data: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in data {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The hash tag of a key, as Redis Cluster reads it: between the first `{` and the
/// first `}` after it, when not empty.
fn hash_tag(key: &str) -> Option<&str> {
    let open = key.find('{')?;
    let close = key[open + 1..].find('}')?;
    (close > 0).then(|| &key[open + 1..open + 1 + close])
}

/// True when every key under `prefix` hashes by a tag within it.
pub fn has_hash_tag(prefix: &str) -> bool {
    hash_tag(prefix).is_some()
}

/// The slot a key hashes to.
pub fn key_slot(key: &str) -> u16 {
    crc16(hash_tag(key).unwrap_or(key).as_bytes()) % CLUSTER_SLOTS
}

/// The prefix of every key name: as given, or on a cluster with the prefix as its
/// hash tag (`{prefix}`) unless it already holds one, so that every key of it hashes
/// to one slot.
pub fn key_prefix(kind: Kind, prefix: &str) -> String {
    if kind == Kind::Cluster && hash_tag(prefix).is_none() {
        format!("{{{prefix}}}")
    } else {
        prefix.to_string()
    }
}

fn io_error(msg: String) -> RedisError {
    RedisError::from(std::io::Error::other(msg))
}

/// A reply the store reconnects after: the node is no longer (or not yet) a primary,
/// or (`CLUSTERDOWN`) it knows no node serving the slot, so the slot's owner is asked
/// again of every node the store knows (a node cut off from the cluster, or taken out
/// of it, keeps answering so while another owns the slot).
pub fn must_reconnect(e: &RedisError) -> bool {
    matches!(e.kind(), ErrorKind::ReadOnly | ErrorKind::MasterDown | ErrorKind::ClusterDown)
        || matches!(e.code(), Some("READONLY" | "MASTERDOWN" | "CLUSTERDOWN"))
}

/// A reply after which the store waits a moment before it reconnects: the cluster
/// itself says it is down, and asking its nodes on every call would not bring it back.
pub fn pause_reconnect(e: &RedisError) -> bool {
    e.kind() == ErrorKind::ClusterDown || e.code() == Some("CLUSTERDOWN")
}

/// How to reach a data node of a sentinel or cluster URL.
#[derive(Clone)]
struct NodeInfo {
    tls: bool,
    redis: RedisConnectionInfo,
    ca: Option<Vec<u8>>,
}

impl NodeInfo {
    fn client(&self, host: &str, port: u16) -> redis::RedisResult<redis::Client> {
        let addr = if self.tls {
            ConnectionAddr::TcpTls { host: host.to_string(), port, insecure: false, tls_params: None }
        } else {
            ConnectionAddr::Tcp(host.to_string(), port)
        };
        let info = ConnectionInfo { addr, redis: self.redis.clone() };
        match &self.ca {
            None => redis::Client::open(info),
            Some(pem) => redis::Client::build_with_tls(
                info,
                redis::TlsCertificates { client_tls: None, root_cert: Some(pem.clone()) },
            ),
        }
    }
}

/// Connect and I/O timeouts.
#[derive(Clone, Copy)]
struct Timeouts {
    connect: Duration,
    io: Duration,
}

fn connect(client: &redis::Client, t: Timeouts) -> redis::RedisResult<redis::Connection> {
    let con = client.get_connection_with_timeout(t.connect)?;
    con.set_read_timeout(Some(t.io))?;
    con.set_write_timeout(Some(t.io))?;
    Ok(con)
}

enum Nodes {
    Single(redis::Client),
    Sentinel {
        sentinels: Vec<(String, redis::Client)>,
        service: String,
        /// The sentinel that answered last, asked first next time.
        first: usize,
        /// The primary connected to last.
        primary: Option<(String, u16)>,
        /// A primary the sentinels announced: tried first at the next connect.
        announced: Option<(String, u16)>,
    },
    Cluster {
        seeds: Vec<(String, u16)>,
        slot: u16,
        /// The node that owned the slot when last asked, asked first next time.
        last: Option<(String, u16)>,
        /// Every node (primaries and replicas) the last `CLUSTER SLOTS` named, asked
        /// after `last` and before the seeds: the URL may name only nodes since gone.
        learned: Vec<(String, u16)>,
    },
}

/// The servers behind a URL, and how to connect to the data node.
pub struct Topology {
    nodes: Nodes,
    node: Option<NodeInfo>,
    wait: Option<Wait>,
    /// The last write's replicas fell short: a new connection counts them (`ROLE`)
    /// before it waits for them again.
    short: bool,
}

impl Topology {
    /// Builds the clients for `addr` (no I/O but reading `?ssl_ca_certs=`), keys named
    /// from `key_prefix`. Errors are `StoreError::Incompatible` (a `DatabaseError`).
    pub fn new(addr: &Address, url: &str, key_prefix: &str) -> Result<Topology, StoreError> {
        let unusable = |e: &dyn std::fmt::Display| {
            StoreError::Incompatible(format!("{url:?} is not a usable Redis URL: {e}"))
        };
        let ca = match &addr.ca_file {
            None => None,
            Some(f) => Some(std::fs::read(f).map_err(|e| unusable(&format!("ssl_ca_certs={f}: {e}")))?),
        };
        let protocol = if addr.resp3 { redis::ProtocolVersion::RESP3 } else { redis::ProtocolVersion::RESP2 };
        let node = NodeInfo {
            tls: addr.tls,
            redis: RedisConnectionInfo {
                db: addr.db,
                username: addr.username.clone(),
                password: addr.password.clone(),
                protocol,
            },
            ca,
        };
        let nodes = match addr.kind {
            Kind::Single => {
                let client = match &node.ca {
                    None => redis::Client::open(addr.base.as_str()),
                    Some(pem) => redis::Client::build_with_tls(
                        addr.base.as_str(),
                        redis::TlsCertificates { client_tls: None, root_cert: Some(pem.clone()) },
                    ),
                };
                let client = client.map_err(|e| unusable(&e))?;
                return Ok(Topology {
                    nodes: Nodes::Single(client),
                    node: None,
                    wait: addr.wait,
                    short: false,
                });
            }
            Kind::Sentinel => {
                let sentinel = NodeInfo {
                    redis: RedisConnectionInfo {
                        db: 0,
                        username: addr.sentinel_username.clone(),
                        password: addr.sentinel_password.clone(),
                        protocol,
                    },
                    ..node.clone()
                };
                let sentinels = addr
                    .hosts
                    .iter()
                    .map(|(h, p)| Ok((format!("{h}:{p}"), sentinel.client(h, *p)?)))
                    .collect::<redis::RedisResult<Vec<_>>>()
                    .map_err(|e| unusable(&e))?;
                Nodes::Sentinel {
                    sentinels,
                    service: addr.service.clone(),
                    first: 0,
                    primary: None,
                    announced: None,
                }
            }
            Kind::Cluster => Nodes::Cluster {
                seeds: addr.hosts.clone(),
                slot: key_slot(&format!("{key_prefix}:log")),
                last: None,
                learned: Vec::new(),
            },
        };
        Ok(Topology { nodes, node: Some(node), wait: addr.wait, short: false })
    }

    /// Remembers whether the last write's replicas fell short, for the next connection.
    pub fn carry_short(&mut self, short: bool) {
        self.short = short;
    }

    pub fn kind(&self) -> Kind {
        match self.nodes {
            Nodes::Single(_) => Kind::Single,
            Nodes::Sentinel { .. } => Kind::Sentinel,
            Nodes::Cluster { .. } => Kind::Cluster,
        }
    }

    /// Sentinel: the sentinels (name, client) and the service, for the thread that
    /// follows their announcements ([`super::redis_sentinel`]).
    pub fn sentinels(&self) -> Option<(Vec<(String, redis::Client)>, String)> {
        match &self.nodes {
            Nodes::Sentinel { sentinels, service, .. } => Some((sentinels.clone(), service.clone())),
            _ => None,
        }
    }

    /// Sentinel: takes in a primary the sentinels announced. True when it is not the one
    /// connected to last (the connection is then to be left: the next connects to it,
    /// if it says it is a primary, else asks the sentinels).
    pub fn announce(&mut self, to: (String, u16)) -> bool {
        match &mut self.nodes {
            Nodes::Sentinel { primary, announced, .. } if primary.as_ref() != Some(&to) => {
                *announced = Some(to);
                true
            }
            _ => false,
        }
    }

    /// The keys a script call declares: on a cluster every key the script may touch
    /// (so that the server routes and checks them); elsewhere none (the script names
    /// its keys from the prefix, as before).
    pub fn script_keys(&self, prefix: &str, owner: &str, layout: &[&str]) -> Vec<String> {
        if self.kind() != Kind::Cluster {
            return Vec::new();
        }
        let mut keys: Vec<String> =
            layout.iter().filter(|k| **k != "applied").map(|k| format!("{prefix}:{k}")).collect();
        if !layout.contains(&"late") {
            keys.push(format!("{prefix}:late"));
        }
        keys.push(format!("{prefix}:applied:{owner}"));
        keys
    }

    /// Connects to the data node: the server, the primary the sentinels name, or the
    /// node owning the prefix's slot.
    pub fn connect(&mut self, connect_timeout: Duration, io_timeout: Duration) -> redis::RedisResult<Link> {
        let t = Timeouts { connect: connect_timeout, io: io_timeout };
        let (wait, short) = (self.wait, self.short);
        let link =
            |con, node| Link { con, node, timeouts: t, wait, short, next_try: None, unconfirmed: None };
        match &mut self.nodes {
            Nodes::Single(client) => Ok(link(connect(client, t)?, None)),
            Nodes::Sentinel { sentinels, service, first, primary, announced } => {
                let node = self.node.as_ref().ok_or_else(|| io_error("no node information".into()))?;
                // The primary the sentinels announced, if it says it is one; else asked.
                if let Some((host, port)) = announced.take() {
                    if let Ok(con) = connect_primary(node, &host, port, t) {
                        *primary = Some((host, port));
                        return Ok(link(con, None));
                    }
                }
                let (i, found, con) = find_primary(sentinels, *first, service, node, t)?;
                *first = i;
                *primary = Some(found);
                Ok(link(con, None))
            }
            Nodes::Cluster { seeds, slot, last, learned } => {
                let node = self.node.as_ref().ok_or_else(|| io_error("no node information".into()))?;
                let (owner, con) = find_slot_owner(seeds, last.as_ref(), learned, *slot, node, t)?;
                *last = Some(owner);
                Ok(link(con, Some(node.clone())))
            }
        }
    }
}

/// Connects to `host:port` if it says it is a primary (`ROLE`: a sentinel may still name
/// a demoted one).
fn connect_primary(
    node: &NodeInfo, host: &str, port: u16, t: Timeouts,
) -> redis::RedisResult<redis::Connection> {
    let mut con = connect(&node.client(host, port)?, t)?;
    match redis::cmd("ROLE").query::<redis::Role>(&mut con)? {
        redis::Role::Primary { .. } => Ok(con),
        other => Err(io_error(format!("{host}:{port} is not a primary ({other:?})"))),
    }
}

/// Asks the sentinels in turn (from `first`) for the primary of `service`, and
/// connects to the first one named that says it is a primary. Returns the index of
/// the sentinel that named it, and the primary.
fn find_primary(
    sentinels: &[(String, redis::Client)], first: usize, service: &str, node: &NodeInfo, t: Timeouts,
) -> redis::RedisResult<(usize, (String, u16), redis::Connection)> {
    let mut problems = Vec::new();
    let mut unknown = 0;
    for k in 0..sentinels.len() {
        let i = (first + k) % sentinels.len();
        let (name, client) = &sentinels[i];
        let asked = connect(client, t).and_then(|mut s| {
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(service)
                .query::<Option<(String, u16)>>(&mut s)
        });
        let (host, port) = match asked {
            Ok(Some(hp)) => hp,
            Ok(None) => {
                unknown += 1;
                problems.push(format!("sentinel {name} knows no service {service:?}"));
                continue;
            }
            Err(e) => {
                problems.push(format!("sentinel {name}: {e}"));
                continue;
            }
        };
        match connect_primary(node, &host, port, t) {
            Ok(con) => return Ok((i, (host, port), con)),
            Err(e) => problems.push(format!("sentinel {name} names {host}:{port} for {service:?}: {e}")),
        }
    }
    let msg = if unknown == sentinels.len() {
        format!("no sentinel knows a service named {service:?} ({})", problems.join("; "))
    } else {
        format!("no primary for service {service:?}: {}", problems.join("; "))
    };
    Err(io_error(msg))
}

/// The node serving `slot` (from `CLUSTER SLOTS`, asked of the last owner, then of
/// each node the last answer named, then of each seed: any node that answers), connected.
/// `learned` becomes the nodes the last answer named.
fn find_slot_owner(
    seeds: &[(String, u16)], last: Option<&(String, u16)>, learned: &mut Vec<(String, u16)>, slot: u16,
    node: &NodeInfo, t: Timeouts,
) -> redis::RedisResult<((String, u16), redis::Connection)> {
    let mut to_ask: Vec<(String, u16)> = Vec::new();
    for hp in last.into_iter().chain(learned.iter()).chain(seeds) {
        if !to_ask.contains(hp) {
            to_ask.push(hp.clone());
        }
    }
    let mut problems = Vec::new();
    for (host, port) in to_ask {
        let asked = node.client(&host, port).and_then(|c| connect(&c, t)).and_then(|mut con| {
            let slots = redis::cmd("CLUSTER").arg("SLOTS").query::<Value>(&mut con)?;
            let nodes = slot_nodes(&slots, &host);
            if !nodes.is_empty() {
                *learned = nodes;
            }
            let owner = slot_owner(&slots, slot, &host)
                .ok_or_else(|| io_error(format!("node {host}:{port} knows no owner of slot {slot}")))?;
            Ok((owner, con))
        });
        match asked {
            Ok((owner, con)) if owner == (host.clone(), port) => return Ok((owner, con)),
            Ok((owner, _)) => {
                let con = node.client(&owner.0, owner.1).and_then(|c| connect(&c, t));
                match con {
                    Ok(con) => return Ok((owner, con)),
                    Err(e) => problems.push(format!("slot {slot} owner {}:{}: {e}", owner.0, owner.1)),
                }
            }
            Err(e) => problems.push(format!("cluster node {host}:{port}: {e}")),
        }
    }
    Err(io_error(format!("no cluster node answered for slot {slot}: {}", problems.join("; "))))
}

/// Every node (primaries and replicas) a `CLUSTER SLOTS` reply names.
fn slot_nodes(reply: &Value, asked: &str) -> Vec<(String, u16)> {
    let mut nodes = Vec::new();
    let Value::Array(ranges) = reply else { return nodes };
    for r in ranges {
        let Value::Array(r) = r else { continue };
        for n in r.iter().skip(2) {
            let Value::Array(n) = n else { continue };
            let (Some(host), Some(port)) = (n.first().and_then(value_text), n.get(1).and_then(value_int))
            else {
                continue;
            };
            let Ok(port) = u16::try_from(port) else { continue };
            let host = if host.is_empty() || host == "?" { asked.to_string() } else { host };
            if !nodes.contains(&(host.clone(), port)) {
                nodes.push((host, port));
            }
        }
    }
    nodes
}

fn value_text(v: &Value) -> Option<String> {
    match v {
        Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        Value::VerbatimString { text, .. } => Some(text.clone()),
        _ => None,
    }
}

fn value_int(v: &Value) -> Option<i64> {
    match v {
        Value::Int(i) => Some(*i),
        _ => value_text(v)?.parse().ok(),
    }
}

/// The primary of `slot` in a `CLUSTER SLOTS` reply (an empty host is the node asked).
fn slot_owner(reply: &Value, slot: u16, asked: &str) -> Option<(String, u16)> {
    let Value::Array(ranges) = reply else { return None };
    for r in ranges {
        let Value::Array(r) = r else { continue };
        let (Some(start), Some(end)) = (r.first().and_then(value_int), r.get(1).and_then(value_int)) else {
            continue;
        };
        if !(start..=end).contains(&i64::from(slot)) {
            continue;
        }
        let Some(Value::Array(primary)) = r.get(2) else { return None };
        let host = primary.first().and_then(value_text)?;
        let port = u16::try_from(primary.get(1).and_then(value_int)?).ok()?;
        let host = if host.is_empty() || host == "?" { asked.to_string() } else { host };
        return Some((host, port));
    }
    None
}

enum Redirect {
    Moved(String),
    Ask(String),
}

fn redirect_of(values: &[Value]) -> Option<Redirect> {
    values.iter().find_map(|v| match v {
        Value::ServerError(e) => {
            let e = RedisError::from(e.clone());
            let (addr, _) = e.redirect_node()?;
            match e.kind() {
                ErrorKind::Moved => Some(Redirect::Moved(addr.to_string())),
                ErrorKind::Ask => Some(Redirect::Ask(addr.to_string())),
                _ => None,
            }
        }
        _ => None,
    })
}

/// The connection to the data node. On a cluster it follows `MOVED` and `ASK`; with
/// `?wait_replicas=` its script calls that write wait for the replicas.
pub struct Link {
    con: redis::Connection,
    /// Cluster: how to reach the node a redirection names.
    node: Option<NodeInfo>,
    timeouts: Timeouts,
    wait: Option<Wait>,
    /// The last `WAIT` fell short: the replicas are counted before the next.
    short: bool,
    next_try: Option<Instant>,
    /// What the last write's `WAIT` said when it fell short (taken by the store).
    unconfirmed: Option<String>,
}

impl Link {
    fn node_at(&self, addr: &str) -> redis::RedisResult<redis::Connection> {
        let node =
            self.node.as_ref().ok_or_else(|| io_error(format!("redirected to {addr} outside a cluster")))?;
        let (host, port) = host_port(addr, 6379, addr).map_err(io_error)?;
        connect(&node.client(&host, port)?, self.timeouts)
    }

    /// Sends `cmd` (packed, `count` replies after `offset`) following redirections. A
    /// `TRYAGAIN` (a multi-key call in a slot whose keys are being moved) is sent again
    /// for up to the connect timeout, then returned (an outage).
    fn send(&mut self, cmd: &[u8], offset: usize, count: usize) -> redis::RedisResult<Vec<Value>> {
        let deadline = Instant::now() + self.timeouts.connect;
        let mut pause = Duration::from_millis(5);
        let mut hops = 0;
        loop {
            let mut replies = if count == 1 && offset == 0 {
                vec![self.con.req_packed_command(cmd)?]
            } else {
                self.con.req_packed_commands(cmd, offset, count)?
            };
            if self.node.is_none() {
                return Ok(replies);
            }
            match redirect_of(&replies) {
                // The slot has a new owner: from now on this connection is to it.
                Some(Redirect::Moved(addr)) if hops < MAX_REDIRECTS => {
                    hops += 1;
                    self.con = self.node_at(&addr)?;
                    continue;
                }
                // Being moved: this call only goes to the node importing it.
                Some(Redirect::Ask(addr)) if hops < MAX_REDIRECTS => {
                    let mut asking = redis::cmd("ASKING").get_packed_command();
                    asking.extend_from_slice(cmd);
                    replies = self.node_at(&addr)?.req_packed_commands(&asking, offset + 1, count)?;
                }
                _ => {}
            }
            let again = replies.iter().any(|v| {
                matches!(v, Value::ServerError(e) if RedisError::from(e.clone()).kind() == ErrorKind::TryAgain)
            });
            if !again || Instant::now() + pause >= deadline {
                return Ok(replies);
            }
            std::thread::sleep(pause);
            pause = (pause * 2).min(Duration::from_millis(100));
            hops = 0;
        }
    }

    /// One round trip: the script (`EVALSHA`, loaded on `NOSCRIPT`), followed in the
    /// same pipeline by `WAIT` for a call that writes when `?wait_replicas=` asks.
    pub fn eval(
        &mut self, script: &redis::Script, eval: &redis::Cmd, writes: bool,
    ) -> redis::RedisResult<Value> {
        let Some(w) = self.wait.filter(|_| writes) else {
            return match eval.query::<Value>(self) {
                Err(e) if e.kind() == ErrorKind::NoScriptError => {
                    script.load(self)?;
                    eval.query(self)
                }
                r => r,
            };
        };
        if self.short {
            // No write is sent to wait for replicas that are not there.
            let now = Instant::now();
            if self.next_try.is_some_and(|t| now < t) {
                return Err(RedisError::from((ErrorKind::TryAgain, "waiting for the primary's replicas")));
            }
            self.next_try = Some(now + WAIT_RETRY_PAUSE);
            let online = match redis::cmd("ROLE").query::<redis::Role>(self)? {
                redis::Role::Primary { replicas, .. } => replicas.len(),
                _ => {
                    return Err(RedisError::from((ErrorKind::ReadOnly, "the node is no longer the primary")))
                }
            };
            if online < w.replicas as usize {
                return Err(RedisError::from((
                    ErrorKind::TryAgain,
                    "the primary has too few replicas",
                    format!("{online} connected, ?wait_replicas={}", w.replicas),
                )));
            }
        }
        let mut pipe = redis::pipe();
        pipe.add_command(eval.clone()).cmd("WAIT").arg(w.replicas).arg(w.timeout_ms);
        let packed = pipe.get_packed_pipeline();
        // The replies are read one by one: an error from `WAIT` says nothing of the
        // script, which may have written.
        let mut replies = self.req_packed_commands(&packed, 0, 2)?;
        if let Some(Value::ServerError(e)) = replies.first() {
            if RedisError::from(e.clone()).kind() == ErrorKind::NoScriptError {
                script.load(self)?;
                replies = self.req_packed_commands(&packed, 0, 2)?;
            }
        }
        let mut it = replies.into_iter();
        let (Some(value), Some(acked)) = (it.next(), it.next()) else {
            return Err(io_error("short reply to a script and WAIT".into()));
        };
        // The script's own error: it wrote nothing.
        let value = value.extract_error()?;
        // `WAIT` failed after the script ran (a primary demoted while it waited answers
        // `UNBLOCKED`): the write was applied and is not confirmed, as when too few
        // replicas acknowledge it. The replicas are counted again after a short pause
        // then, not after the whole `WAIT` timeout.
        let (acked, why, pause) = match acked {
            Value::ServerError(e) => {
                (0, format!(" (WAIT failed: {})", RedisError::from(e)), WAIT_RETRY_PAUSE)
            }
            v => {
                let pause = WAIT_RETRY_PAUSE.max(Duration::from_millis(w.timeout_ms));
                (value_int(&v).unwrap_or(0), String::new(), pause)
            }
        };
        if acked < i64::from(w.replicas) {
            self.short = true;
            self.next_try = Some(Instant::now() + pause);
            self.unconfirmed = Some(format!(
                "redis: WAIT: {acked} of {} replicas acknowledged the write within {} ms{why}",
                w.replicas, w.timeout_ms
            ));
        } else {
            self.short = false;
        }
        Ok(value)
    }

    /// True while the replicas of the last write fell short (`WAIT` or `ROLE`).
    pub fn short(&self) -> bool {
        self.short && self.wait.is_some()
    }

    /// Takes what the last write's `WAIT` said when it fell short.
    pub fn take_unconfirmed(&mut self) -> Option<String> {
        self.unconfirmed.take()
    }
}

impl ConnectionLike for Link {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<Value> {
        Ok(self.send(cmd, 0, 1)?.pop().unwrap_or(Value::Nil))
    }

    fn req_packed_commands(
        &mut self, cmd: &[u8], offset: usize, count: usize,
    ) -> redis::RedisResult<Vec<Value>> {
        self.send(cmd, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.con.get_db()
    }

    fn check_connection(&mut self) -> bool {
        self.con.check_connection()
    }

    fn is_open(&self) -> bool {
        self.con.is_open()
    }
}

#[cfg(test)]
mod tests;
