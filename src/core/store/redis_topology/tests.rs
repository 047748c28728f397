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
