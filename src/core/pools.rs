//! Quota pool keys (SPEC §8.1) and local endpoints (SPEC §6.1 step 1).
//!
//! Pure functions: no DNS, no I/O, and no input makes them panic.

use crate::core::providers::{self, Pool};
use std::net::{Ipv4Addr, Ipv6Addr};

/// The bucket a (platform, model) draws its provider quota from (SPEC §8.1).
///
/// The platform is case-sensitive (SPEC 18.6: the tables name lower-case
/// platforms; another spelling is another platform) and appears as given in the key;
/// the model id is trimmed and otherwise kept as given. The provider's pool rule
/// (`core::providers`): its own rule, its fixed pool, `<platform>::free` for an
/// aggregator with one free pool; anything else `<platform>::<model_id>`, or
/// `<platform>::account` without a model (an empty or blank model id counts as none).
pub fn infer_quota_pool_key(platform: &str, model_id: Option<&str>) -> String {
    let model = model_id.map(str::trim).filter(|m| !m.is_empty());
    match providers::lookup(platform).pool {
        Pool::Rule(rule) => rule(model).to_owned(),
        Pool::Fixed(key) => key.to_owned(),
        Pool::Free => format!("{platform}::free"),
        Pool::PerModel => match model {
            Some(model) => format!("{platform}::{model}"),
            None => format!("{platform}::account"),
        },
    }
}

/// True for every platform whose pool spans the whole account: a fixed or free pool
/// in SPEC §8.1, or a rule of its own. Case-sensitive (SPEC 18.6).
pub fn is_shared_pool(platform: &str) -> bool {
    !matches!(providers::lookup(platform).pool, Pool::PerModel)
}

/// Whether `base_url` points at a loopback or private host (SPEC §6.1 step 1):
/// a literal IPv4 in 127/8, 10/8, 172.16/12, 192.168/16 or 169.254/16; a
/// literal IPv6 `::1`, in fc00::/7 or fe80::/10, or IPv4-mapped
/// (`::ffff:a.b.c.d`) onto one of the IPv4 ranges; or `localhost` /
/// `*.localhost` (case-insensitive, a trailing dot allowed). No DNS lookups.
///
/// The URL is read by hand: the scheme is optional (`localhost:11434`), user
/// info and port are skipped, IPv6 hosts are bracketed (`http://[::1]:8080/v1`;
/// a zone id like `%25eth0` is ignored). Anything unreadable is `false`.
pub fn is_local_base_url(base_url: &str) -> bool {
    host_of(base_url).is_some_and(|host| is_local_host(&host))
}

/// A URL's host, lowercased, without brackets or a trailing dot.
#[derive(Debug, PartialEq, Eq)]
enum Host {
    /// Written in brackets: only an IPv6 literal (maybe with a zone) is valid.
    Bracketed(String),
    Plain(String),
}

/// The host part of a URL.
fn host_of(url: &str) -> Option<Host> {
    let url = url.trim();
    let rest = match url.find("://") {
        Some(i) => url.get(i + 3..)?,
        None => url.strip_prefix("//").unwrap_or(url),
    };
    let authority = rest.split(['/', '?', '#', '\\']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if authority.contains(char::is_whitespace) {
        return None;
    }
    if let Some(bracketed) = host_port.strip_prefix('[') {
        let (inside, after) = bracketed.split_once(']')?;
        if !(after.is_empty() || after.starts_with(':')) || inside.is_empty() {
            return None;
        }
        return Some(Host::Bracketed(inside.to_ascii_lowercase()));
    }
    let host = if host_port.parse::<Ipv6Addr>().is_ok() {
        // A bare IPv6 literal without brackets (no port possible).
        host_port
    } else {
        host_port.split(':').next()?
    };
    let host = host.strip_suffix('.').unwrap_or(host);
    if host.is_empty() {
        return None;
    }
    Some(Host::Plain(host.to_ascii_lowercase()))
}

fn is_local_host(host: &Host) -> bool {
    match host {
        Host::Bracketed(inside) => {
            // A zone id ("fe80::1%25eth0" in URLs) only names an interface.
            let without_zone = inside.split('%').next().unwrap_or(inside);
            without_zone.parse::<Ipv6Addr>().is_ok_and(is_local_v6)
        }
        Host::Plain(name) => {
            if name == "localhost" || name.ends_with(".localhost") {
                return true;
            }
            if let Ok(v4) = name.parse::<Ipv4Addr>() {
                return is_local_v4(v4);
            }
            let without_zone = name.split('%').next().unwrap_or(name);
            without_zone.parse::<Ipv6Addr>().is_ok_and(is_local_v6)
        }
    }
}

fn is_local_v4(ip: Ipv4Addr) -> bool {
    ip.is_loopback() || ip.is_private() || ip.is_link_local()
}

fn is_local_v6(ip: Ipv6Addr) -> bool {
    let first = ip.segments()[0];
    ip.is_loopback()
        || (first & 0xfe00) == 0xfc00 // fc00::/7 unique local
        || (first & 0xffc0) == 0xfe80 // fe80::/10 link local
        || ip.to_ipv4_mapped().is_some_and(is_local_v4)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn local_hosts() {
        for url in [
            "http://localhost:11434/v1",
            "localhost:11434",
            "localhost",
            "LOCALHOST",
            "http://LocalHost./v1",
            "http://ollama.localhost:8080",
            "https://a.b.localhost/",
            "http://127.0.0.1:8080/v1",
            "127.0.0.1",
            "http://127.255.255.254",
            "http://10.0.0.5/v1",
            "http://172.16.0.1",
            "http://172.31.255.255",
            "http://192.168.1.20:1234/v1",
            "http://169.254.169.254/latest",
            "http://[::1]:8080/v1",
            "http://[::1]",
            "[::1]:8080",
            "::1",
            "http://[fc00::1]/v1",
            "http://[fd12:3456::1]:443",
            "http://[fe80::1]",
            "http://[fe80::1%25eth0]:80",
            "http://[febf::1]",
            "http://[::ffff:127.0.0.1]:8000",
            "http://[::ffff:192.168.0.1]",
            "http://[::ffff:7f00:1]",
            "http://user:pw@127.0.0.1/v1",
            "http://user@localhost:1",
            "http://127.0.0.1.:8080",
            "  http://127.0.0.1  ",
            "http://10.0.0.1?x=1",
            "http://10.0.0.1#frag",
            "//127.0.0.1/v1",
            "ws://127.0.0.1",
        ] {
            assert!(is_local_base_url(url), "{url}");
        }
    }

    #[test]
    fn public_or_garbage_hosts() {
        for url in [
            "https://api.openai.com/v1",
            "https://api.example.com/openai/v1",
            "http://8.8.8.8",
            "http://172.15.255.255",
            "http://172.32.0.1",
            "http://192.169.0.1",
            "http://169.255.0.1",
            "http://11.0.0.1",
            "http://0.0.0.0",
            "http://[2001:db8::1]",
            "http://[fec0::1]",
            "http://[::ffff:8.8.8.8]",
            "http://[::2]",
            "http://localhost.example.com",
            "http://notlocalhost",
            "http://mylocalhost",
            "http://localhost@evil.com/",
            "http://evil.com/127.0.0.1",
            "http://evil.com?h=localhost",
            "http://127.0.0.1.evil.com",
            "http://127.1",
            "http://2130706433",
            "http://[127.0.0.1]",
            "http://[::1",
            "http://[::1]x",
            "http://[]",
            "http://",
            "",
            "   ",
            "://",
            "http://local host",
            "http://:8080",
            "🦀://localhost\u{0}",
            "http://[::1]\u{fe0f}",
        ] {
            assert!(!is_local_base_url(url), "{url:?}");
        }
    }

    proptest! {
        #[test]
        fn local_never_panics(s in any::<String>()) {
            let _ = is_local_base_url(&s);
        }

        #[test]
        fn local_url_like(s in "[a-z]{0,5}(://)?([a-z]{0,3}@)?(\\[[0-9a-f:.%]{0,20}\\]|[0-9.]{0,16}|[a-z.]{0,12})(:[0-9]{0,6})?(/[a-z]{0,4})?") {
            let _ = is_local_base_url(&s);
        }

        #[test]
        fn private_v4_is_local(b in any::<u8>(), c in any::<u8>(), d in any::<u8>(), port in any::<u16>()) {
            for a in ["127", "10"] {
                let url = format!("http://{a}.{b}.{c}.{d}:{port}/v1");
                prop_assert!(is_local_base_url(&url), "{}", url);
            }
            let url = format!("http://192.168.{c}.{d}");
            prop_assert!(is_local_base_url(&url), "{}", url);
        }

        #[test]
        fn pool_keys_never_panic(p in any::<String>(), m in proptest::option::of(any::<String>())) {
            let key = infer_quota_pool_key(&p, m.as_deref());
            let prefix = format!("{p}::");
            prop_assert!(key.starts_with(&prefix), "{} {}", key, prefix);
            let _ = is_shared_pool(&p);
        }
    }
}
