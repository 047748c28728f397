use super::*;

#[test]
fn slots_are_redis_clusters() {
    assert_eq!(crc16(b"123456789"), 0x31c3);
    // Values from `CLUSTER KEYSLOT`.
    assert_eq!(key_slot("foo"), 12182);
    assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
    assert_eq!(key_slot("foo{}{bar}"), crc16(b"foo{}{bar}") % CLUSTER_SLOTS);
    assert_eq!(key_prefix(Kind::Cluster, "fleet"), "{fleet}");
    assert_eq!(key_prefix(Kind::Cluster, "a{b}c"), "a{b}c");
    assert_eq!(key_prefix(Kind::Cluster, "a{}"), "{a{}}");
    assert_eq!(key_prefix(Kind::Sentinel, "fleet"), "fleet");
    assert!(!has_hash_tag(&key_prefix(Kind::Cluster, "}{")), "refused at open");
    for p in ["fleet", "a{b}c", "a{}", "x}y", "{", "x}{"] {
        let k = key_prefix(Kind::Cluster, p);
        let slots: Vec<u16> =
            ["log", "lock", "applied:0123"].iter().map(|s| key_slot(&format!("{k}:{s}"))).collect();
        assert!(slots.iter().all(|s| *s == slots[0]), "{p}: {slots:?}");
    }
}

#[test]
fn cluster_slots_name_the_owner_and_every_node() {
    let node = |h: &str, p: i64| {
        Value::Array(vec![Value::BulkString(h.into()), Value::Int(p), Value::BulkString(b"id".to_vec())])
    };
    let reply = Value::Array(vec![
        Value::Array(vec![Value::Int(0), Value::Int(5460), node("127.0.0.1", 7000), node("", 7003)]),
        Value::Array(vec![Value::Int(5461), Value::Int(16383), node("h2", 7001), node("127.0.0.1", 7000)]),
    ]);
    assert_eq!(slot_owner(&reply, 17, "seed"), Some(("127.0.0.1".into(), 7000)));
    assert_eq!(slot_owner(&reply, 5461, "seed"), Some(("h2".into(), 7001)));
    assert_eq!(
        slot_nodes(&reply, "seed"),
        [("127.0.0.1".into(), 7000), ("seed".into(), 7003), ("h2".into(), 7001)]
    );
    assert!(slot_nodes(&Value::Array(vec![]), "seed").is_empty());
}

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
    let s =
        parse("redis://h:1/0?prefix=p&wait_replicas=2&wait_timeout_ms=50&protocol=resp3").expect("parses");
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
    assert!(is_variant("redis+sentinel://x") && is_variant("rediss+foo://x") && !is_variant("redis+://x"));
    assert!(!is_variant("/tmp/redis+x://y"));
}
