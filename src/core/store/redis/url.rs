//! A Redis URL taken apart before any I/O (SPEC 19.3): which topology (one server,
//! Sentinel or Cluster), its hosts, its credentials and this engine's own query
//! parameters (`?prefix=`, `?ssl_ca_certs=`, `?wait_replicas=`...). Errors in a URL are
//! the caller's (`ValueError`). The store opens by it and the topology connects by it.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Single,
    Sentinel,
    Cluster,
}

/// `?wait_replicas=N&wait_timeout_ms=T`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    pub replicas: u32,
    pub timeout_ms: u64,
}

/// A URL taken apart, before any I/O. Errors in it are the caller's (`ValueError`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Address {
    pub kind: Kind,
    /// One server: the URL redis-rs opens (this engine's parameters taken out).
    pub base: String,
    /// Sentinels, or cluster seed nodes.
    pub hosts: Vec<(String, u16)>,
    pub tls: bool,
    /// Sentinel: the monitored service's name.
    pub service: String,
    pub db: i64,
    pub username: Option<String>,
    pub password: Option<String>,
    pub sentinel_username: Option<String>,
    pub sentinel_password: Option<String>,
    pub resp3: bool,
    /// `?prefix=` as given (see `redis_topology::key_prefix` for a cluster's key names).
    pub prefix: String,
    pub ca_file: Option<String>,
    pub wait: Option<Wait>,
}

/// True for `redis+<anything>://` and `rediss+<anything>://`: a Redis URL, whose
/// variant [`parse`] checks (an unknown one is a `ValueError`, not a file name).
pub fn is_variant(path: &str) -> bool {
    let Some((scheme, _)) = path.split_once("://") else { return false };
    let variant = scheme.strip_prefix("redis+").or_else(|| scheme.strip_prefix("rediss+"));
    variant.is_some_and(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_alphanumeric()))
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

pub fn host_port(h: &str, default_port: u16, url: &str) -> Result<(String, u16), String> {
    let (host, port) = if let Some(rest) = h.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(|| format!("bad host {h:?} in {url:?}"))?;
        (host, after.strip_prefix(':'))
    } else {
        match h.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (h, None),
        }
    };
    if host.is_empty() {
        return Err(format!("empty host name in {url:?}"));
    }
    let port = match port {
        None => default_port,
        Some(p) => {
            p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| format!("bad port {p:?} in {url:?}"))?
        }
    };
    Ok((host.to_string(), port))
}

/// Takes a Redis URL apart (SPEC 19.3). Errors name what is wrong with the URL.
pub fn parse(url: &str) -> Result<Address, String> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| format!("{url:?} is not a Redis URL"))?;
    let (kind, tls) = match scheme {
        "redis+sentinel" => (Kind::Sentinel, false),
        "rediss+sentinel" => (Kind::Sentinel, true),
        "redis+cluster" => (Kind::Cluster, false),
        "rediss+cluster" => (Kind::Cluster, true),
        "redis" | "redis+unix" | "unix" => (Kind::Single, false),
        "rediss" => (Kind::Single, true),
        other => {
            return Err(format!(
                "unknown Redis URL scheme {other:?} in {url:?}: redis://, rediss://, redis+unix://, \
                 redis+sentinel://, rediss+sentinel://, redis+cluster:// or rediss+cluster://"
            ))
        }
    };
    let (head, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut addr = Address {
        kind,
        base: url.to_string(),
        hosts: Vec::new(),
        tls,
        service: String::new(),
        db: 0,
        username: None,
        password: None,
        sentinel_username: None,
        sentinel_password: None,
        resp3: false,
        prefix: "quotaengine".into(),
        ca_file: None,
        wait: None,
    };
    let (mut replicas, mut timeout_ms) = (None, 1000u64);
    let mut rest_query = Vec::new();
    for kv in query.split('&').filter(|kv| !kv.is_empty()) {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        match k {
            "wait_replicas" => {
                replicas = Some(v.parse::<u32>().map_err(|_| {
                    format!("?wait_replicas= takes a number of replicas (0 or more), not {v:?}, in {url:?}")
                })?)
            }
            "wait_timeout_ms" => {
                timeout_ms =
                    v.parse::<u64>().ok().filter(|t| (1..=3_600_000).contains(t)).ok_or_else(|| {
                        format!(
                            "?wait_timeout_ms= takes milliseconds from 1 to 3600000, not {v:?}, in {url:?}"
                        )
                    })?
            }
            "sentinel_password" | "sentinel_username" if kind != Kind::Sentinel => {
                return Err(format!("?{k}= is for redis+sentinel:// URLs, not {url:?}"))
            }
            "sentinel_password" => addr.sentinel_password = Some(percent_decode(v)),
            "sentinel_username" => addr.sentinel_username = Some(percent_decode(v)),
            _ if kind == Kind::Single => rest_query.push(kv),
            "prefix" => addr.prefix = v.to_string(),
            "ssl_ca_certs" => addr.ca_file = Some(v.to_string()),
            "protocol" => {
                addr.resp3 = match v {
                    "resp3" | "3" => true,
                    "resp2" | "2" => false,
                    _ => return Err(format!("?protocol= is resp2 or resp3, not {v:?}, in {url:?}")),
                }
            }
            _ => return Err(format!("unknown parameter ?{k}= in {url:?}")),
        }
    }
    addr.wait = replicas.filter(|n| *n > 0).map(|replicas| Wait { replicas, timeout_ms });
    if kind == Kind::Single {
        // The parameters redis-rs and `parse_address` know stay in the URL.
        let base =
            if rest_query.is_empty() { head.to_string() } else { format!("{head}?{}", rest_query.join("&")) };
        let single = parse_address(&format!("{scheme}://{base}"));
        addr.base = single.base;
        addr.prefix = single.prefix;
        addr.ca_file = single.ca_file;
        return Ok(addr);
    }
    let (userinfo, hostpath) = match head.rfind('@') {
        Some(i) => (Some(&head[..i]), &head[i + 1..]),
        None => (None, head),
    };
    if let Some(info) = userinfo {
        let (user, password) = match info.split_once(':') {
            Some((u, p)) => (u, Some(p)),
            None => (info, None),
        };
        addr.username = Some(percent_decode(user)).filter(|u| !u.is_empty());
        addr.password = password.map(percent_decode).filter(|p| !p.is_empty());
    }
    let (hosts, path) = hostpath.split_once('/').unwrap_or((hostpath, ""));
    let default_port = if kind == Kind::Sentinel { 26379 } else { 6379 };
    for h in hosts.split(',') {
        if h.is_empty() {
            continue;
        }
        addr.hosts.push(host_port(h, default_port, url)?);
    }
    if addr.hosts.is_empty() {
        let what = if kind == Kind::Sentinel { "sentinel" } else { "cluster node" };
        return Err(format!("no {what} host in {url:?}: {scheme}://host1:port[,host2:port...]"));
    }
    let mut parts = path.split('/').filter(|p| !p.is_empty());
    match kind {
        Kind::Sentinel => {
            addr.service = percent_decode(parts.next().ok_or_else(|| {
                format!("no service name in {url:?}: {scheme}://host:port[,host:port...]/<service>[/<db>]")
            })?);
            if let Some(db) = parts.next() {
                addr.db = db
                    .parse::<i64>()
                    .ok()
                    .filter(|d| *d >= 0)
                    .ok_or_else(|| format!("bad database number {db:?} in {url:?}"))?;
            }
            if let Some(extra) = parts.next() {
                return Err(format!("unexpected {extra:?} after the database number in {url:?}"));
            }
        }
        _ => {
            if let Some(p) = parts.next() {
                return Err(format!(
                    "a cluster has only database 0: no /{p} in {url:?} (the query may follow the hosts, \
                     with or without a /)"
                ));
            }
        }
    }
    Ok(addr)
}

/// A `redis://...` address taken apart: what the client gets, and this engine's own
/// query parameters.
#[derive(Debug, PartialEq, Eq)]
struct RedisAddress {
    /// The URL without this engine's parameters.
    pub base: String,
    /// `?prefix=` (default `quotaengine`).
    pub prefix: String,
    /// `?ssl_ca_certs=` (as in redis-py): a PEM file of the CAs to trust for
    /// `rediss://` instead of the built-in web roots (a private CA).
    pub ca_file: Option<String>,
}

fn parse_address(url: &str) -> RedisAddress {
    let mut addr = RedisAddress { base: url.to_string(), prefix: "quotaengine".to_string(), ca_file: None };
    let Some((base, query)) = url.split_once('?') else { return addr };
    let rest: Vec<&str> = query
        .split('&')
        .filter(|kv| {
            if let Some(p) = kv.strip_prefix("prefix=") {
                addr.prefix = p.to_string();
            } else if let Some(f) = kv.strip_prefix("ssl_ca_certs=") {
                addr.ca_file = Some(f.to_string());
            } else {
                return !kv.is_empty();
            }
            false
        })
        .collect();
    addr.base = if rest.is_empty() { base.to_string() } else { format!("{base}?{}", rest.join("&")) };
    addr
}

/// True when `path` names a Redis server rather than a file.
pub fn is_redis_url(path: &str) -> bool {
    ["redis://", "rediss://", "redis+unix://", "unix://"].iter().any(|s| path.starts_with(s))
        || is_variant(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_come_apart() {
        let a = parse("redis+sentinel://u:p%40ss@h1:26379,h2,[::1]:26380/mymaster/2?prefix=f&wait_replicas=1&sentinel_password=sp")
            .expect("parses");
        assert_eq!(a.kind, Kind::Sentinel);
        assert_eq!(a.hosts, [("h1".into(), 26379), ("h2".into(), 26379), ("::1".into(), 26380)]);
        assert_eq!((a.service.as_str(), a.db, a.prefix.as_str()), ("mymaster", 2, "f"));
        assert_eq!((a.username.as_deref(), a.password.as_deref()), (Some("u"), Some("p@ss")));
        assert_eq!(a.sentinel_password.as_deref(), Some("sp"));
        assert_eq!(a.wait, Some(Wait { replicas: 1, timeout_ms: 1000 }));
        for url in ["redis+cluster://h1:7000,h2:7001?prefix=x", "redis+cluster://h1:7000,h2:7001/?prefix=x"] {
            let c = parse(url).expect("parses");
            assert_eq!((c.kind, c.hosts.len(), c.prefix.as_str(), c.tls), (Kind::Cluster, 2, "x", false));
        }
        assert!(parse("rediss+cluster://h:1").expect("parses").tls);
        let s = parse("redis://h:1/0?prefix=p&wait_replicas=2&wait_timeout_ms=50&protocol=resp3")
            .expect("parses");
        assert_eq!((s.base.as_str(), s.prefix.as_str()), ("redis://h:1/0?protocol=resp3", "p"));
        assert_eq!(s.wait, Some(Wait { replicas: 2, timeout_ms: 50 }));
        for (bad, says) in [
            ("redis+sentinel:///mymaster", "no sentinel host"),
            ("redis+sentinel://h:26379", "no service name"),
            ("redis+sentinel://h:26379/", "no service name"),
            ("redis+cluster://?prefix=a", "no cluster node host"),
            ("redis+cluster://h:7000/0", "only database 0"),
            ("redis+clustr://h:7000", "unknown Redis URL scheme"),
            ("redis+sentinel://h:x/s", "bad port"),
            ("redis+sentinel://h/s/x", "bad database"),
            ("redis://h/0?wait_replicas=-1", "wait_replicas"),
            ("redis://h/0?wait_timeout_ms=0", "wait_timeout_ms"),
            ("redis://h/0?sentinel_password=x", "sentinel"),
            ("redis+cluster://h:1?bogus=1", "unknown parameter"),
        ] {
            let err = parse(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
        }
        assert!(
            is_variant("redis+sentinel://x") && is_variant("rediss+foo://x") && !is_variant("redis+://x")
        );
        assert!(!is_variant("/tmp/redis+x://y"));
    }

    #[test]
    fn prefix_and_ca_come_out_of_the_url() {
        let addr = |base: &str, prefix: &str, ca: Option<&str>| RedisAddress {
            base: base.into(),
            prefix: prefix.into(),
            ca_file: ca.map(Into::into),
        };
        assert_eq!(parse_address("redis://h:1/0"), addr("redis://h:1/0", "quotaengine", None));
        assert_eq!(parse_address("redis://h:1/0?prefix=fleet"), addr("redis://h:1/0", "fleet", None));
        assert_eq!(
            parse_address("redis://h/0?protocol=resp3&prefix=a"),
            addr("redis://h/0?protocol=resp3", "a", None)
        );
        assert_eq!(
            parse_address("rediss://h/0?ssl_ca_certs=/etc/ca.pem&prefix=a"),
            addr("rediss://h/0", "a", Some("/etc/ca.pem"))
        );
        assert!(is_redis_url("rediss://x") && !is_redis_url("/tmp/redis://x"));
    }
}
