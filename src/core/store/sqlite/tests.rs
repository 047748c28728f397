use super::*;
use crate::core::store::TenantLimitsRow;

const T0: i64 = 1_767_261_600_000;

fn tenants(names: &[&str]) -> TenantList {
    names.iter().map(|n| Arc::from(*n)).collect()
}

fn request(at: i64, t: &[&str]) -> UsageRow {
    UsageRow {
        platform: Arc::from("p"),
        model_id: Arc::from("m"),
        key_id: 1,
        kind: UsageKind::Request,
        tokens: 0,
        count: 1,
        created_at_ms: at,
        kinds: TokenKinds::default(),
        cost: 0,
        tenants: tenants(t),
    }
}

fn load(s: &mut SqliteStore) -> (Vec<UsageRow>, Changes) {
    let mut rows = Vec::new();
    s.begin(false).expect("begin");
    s.load_usage_since(0, &mut |u| rows.push(u)).expect("load");
    let ch = s.pull().expect("pull");
    s.commit().expect("commit");
    (rows, ch)
}

/// SPEC 23.2, schema version 13: a version-12 file migrates with its rows as they
/// were (no tenants); rows and leases written after hold their tenants as a JSON array
/// SQLite's `json_each` reads, and a plain writer's JSON is read back.
#[test]
fn a_version_12_file_migrates_and_keeps_tenants_as_json() {
    let dir = tempfile::tempdir().expect("dir");
    let path = dir.path().join("q.db");
    let path = path.to_str().expect("path");
    drop(SqliteStore::open(path, false, 5_000).expect("open"));
    let c = Connection::open(path).expect("sqlite");
    c.execute_batch(
        "ALTER TABLE rate_limit_usage DROP COLUMN tenants;
         ALTER TABLE quota_leases DROP COLUMN tenants;
         DROP TABLE tenant_limits;
         DELETE FROM quotaengine_meta WHERE name = 'tenant_limits';
         PRAGMA user_version = 12;
         INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms)
             VALUES ('p', 'm', 1, 'request', 0, 1767261600000);
         INSERT INTO quota_leases (id, platform, model_id, key_id, tokens, created_at_ms, expires_at_ms)
             VALUES (5, 'p', 'm', 1, 10, 1767261600000, 1767261660000);",
    )
    .expect("version 12");
    let mut s = SqliteStore::open(path, false, 5_000).expect("migrates");
    let version: i64 = c.query_row("PRAGMA user_version", [], |r| r.get(0)).expect("version");
    assert_eq!(version, 13);
    let (rows, ch) = load(&mut s);
    assert_eq!(rows, vec![request(T0, &[])]);
    let leases = ch.leases.expect("leases");
    assert_eq!((leases.len(), leases[0].tenants.len()), (1, 0));
    assert_eq!(ch.tenant_limits, Some(vec![]), "no declaration yet");
    s.begin(true).expect("begin");
    let _ = s.pull().expect("pull");
    let names = ["user:a", "team \"x\"", "back\\slash", "é🦀"];
    s.write(&Write::Usage(request(T0 + 1, &names))).expect("usage");
    let lease = LeaseRow { id: 6, tenants: tenants(&["user:a"]), ..leases[0].clone() };
    s.write(&Write::InsertLease(lease.clone())).expect("lease");
    let decl = TenantLimitsRow {
        tenant: "team:*".into(),
        limits: vec![Limit::parse("cost", 5, "day", "account").expect("limit")],
        tz: Some("Europe/Paris".into()),
    };
    s.write(&Write::SetTenantLimits(decl.clone())).expect("declare");
    s.commit().expect("commit");
    let column: Vec<Option<String>> = c
        .prepare("SELECT tenants FROM rate_limit_usage ORDER BY id")
        .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect())
        .expect("column");
    assert_eq!(column, vec![None, Some(r#"["user:a","team \"x\"","back\\slash","é🦀"]"#.to_string())]);
    let each: Vec<String> = c
        .prepare(
            "SELECT j.value FROM rate_limit_usage, json_each(rate_limit_usage.tenants) AS j ORDER BY j.key",
        )
        .and_then(|mut st| st.query_map([], |r| r.get(0))?.collect())
        .expect("json_each");
    assert_eq!(each, names);
    let lease_column: Option<String> =
        c.query_row("SELECT tenants FROM quota_leases WHERE id = 6", [], |r| r.get(0)).expect("lease");
    assert_eq!(lease_column.as_deref(), Some(r#"["user:a"]"#));
    let stored: (String, String, Option<String>) = c
        .query_row("SELECT tenant, limits, tz FROM tenant_limits", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .expect("declaration");
    assert_eq!(stored, ("team:*".into(), "cost/day=5".into(), Some("Europe/Paris".into())));
    // A plain writer's JSON (SQLite's own json_array), and a value it spoiled (none).
    c.execute_batch(
        "INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms, tenants)
             VALUES ('p', 'm', 1, 'request', 0, 1767261600002, json_array('a', 'b\"c'));
         INSERT INTO rate_limit_usage (platform, model_id, key_id, kind, tokens, created_at_ms, tenants)
             VALUES ('p', 'm', 1, 'request', 0, 1767261600003, '[1, spoiled');",
    )
    .expect("plain writer");
    let mut other = SqliteStore::open(path, false, 5_000).expect("open");
    let (rows, ch) = load(&mut other);
    let got: Vec<TenantList> = rows.iter().map(|u| u.tenants.clone()).collect();
    assert_eq!(got, vec![tenants(&[]), tenants(&names), tenants(&["a", "b\"c"]), tenants(&[])]);
    let mut leases = ch.leases.expect("leases");
    leases.sort_by_key(|l| l.id);
    assert_eq!(leases[1], lease);
    assert_eq!(ch.tenant_limits, Some(vec![decl]));
}
