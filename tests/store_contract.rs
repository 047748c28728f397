//! One contract for every store: the same store-level tests run against the memory
//! twin, a SQLite file and a real Redis server (started on a free loopback port;
//! skipped, with a message, where `redis-server` is not installed). What a backend
//! may do its own way (deletes' counts, claims, knowing it is alone) is asked of it,
//! not assumed.
#![allow(clippy::unwrap_used)]

use quotaengine::core::error::StoreError;
use quotaengine::core::limits::{Limit, LimitSet};
use quotaengine::core::money::Prices;
use quotaengine::core::store::memory::{Control, MemoryStore};
use quotaengine::core::store::sqlite::SqliteStore;
use quotaengine::core::store::{
    Changes, CooldownRow, HistoryKind, HistoryRow, KeptUsage, LeaseRow, LogRow, QuotaStateRow, Store,
    TenantLimitsRow, TokenKinds, UsageFilter, UsageKind, UsageRow, Write,
};
use quotaengine::core::tenants::TenantList;
use quotaengine::core::types::{CapSetting, CooldownSource, KeyInfo, ModelInfo};
use std::sync::Arc;

const T0: i64 = 1_767_261_600_000; // 2026-01-01 10:00 UTC

/// A store to test: handles on one shared state, as engines of several processes open it.
trait Backend {
    fn open(&self) -> Box<dyn Store>;
    fn open_readonly(&self) -> Box<dyn Store>;
    /// `try_claim` is exclusive across handles (a store shared by hosts).
    fn claims_are_shared(&self) -> bool;
    /// `sole_writer` can say yes (a store on one host that knows who has it open).
    fn knows_sole_writer(&self) -> bool;
}

struct Memory(Control);

impl Memory {
    fn new() -> Memory {
        Memory(MemoryStore::new().control())
    }
}

impl Backend for Memory {
    fn open(&self) -> Box<dyn Store> {
        Box::new(self.0.connect())
    }
    fn open_readonly(&self) -> Box<dyn Store> {
        Box::new(self.0.connect_readonly())
    }
    fn claims_are_shared(&self) -> bool {
        true
    }
    fn knows_sole_writer(&self) -> bool {
        true
    }
}

struct Sqlite {
    dir: tempfile::TempDir,
}

impl Sqlite {
    fn new() -> Sqlite {
        Sqlite { dir: tempfile::tempdir().unwrap() }
    }
    fn path(&self) -> String {
        self.dir.path().join("q.db").to_str().unwrap().to_string()
    }
}

impl Backend for Sqlite {
    fn open(&self) -> Box<dyn Store> {
        Box::new(SqliteStore::open(&self.path(), false, 5_000).unwrap())
    }
    fn open_readonly(&self) -> Box<dyn Store> {
        Box::new(SqliteStore::open(&self.path(), true, 5_000).unwrap())
    }
    fn claims_are_shared(&self) -> bool {
        false
    }
    fn knows_sole_writer(&self) -> bool {
        true
    }
}

#[cfg(feature = "redis")]
mod redis_server {
    use super::*;
    use quotaengine::core::store::redis::RedisStore;
    use std::net::TcpListener;
    use std::process::{Child, Command, Stdio};
    use std::time::{Duration, Instant};

    pub struct Redis {
        child: Child,
        port: u16,
        _dir: tempfile::TempDir,
    }

    impl Redis {
        /// A server of its own, or `None` (said on stderr) when redis-server is missing.
        pub fn start() -> Option<Redis> {
            let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let dir = tempfile::tempdir().unwrap();
            let spawned = Command::new("redis-server")
                .args([
                    "--port",
                    &port.to_string(),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ])
                .current_dir(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            let child = match spawned {
                Ok(c) => c,
                Err(e) => {
                    eprintln!(
                        "skipped on Redis: cannot start redis-server ({e}); apt-get install redis-server"
                    );
                    return None;
                }
            };
            let server = Redis { child, port, _dir: dir };
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
                assert!(Instant::now() < deadline, "redis-server did not start");
                std::thread::sleep(Duration::from_millis(20));
            }
            Some(server)
        }

        fn url(&self) -> String {
            format!("redis://127.0.0.1:{}/0?prefix=contract", self.port)
        }
    }

    impl Drop for Redis {
        fn drop(&mut self) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }

    impl Backend for Redis {
        fn open(&self) -> Box<dyn Store> {
            Box::new(RedisStore::open(&self.url(), false, 5_000).unwrap())
        }
        fn open_readonly(&self) -> Box<dyn Store> {
            Box::new(RedisStore::open(&self.url(), true, 5_000).unwrap())
        }
        fn claims_are_shared(&self) -> bool {
            true
        }
        fn knows_sole_writer(&self) -> bool {
            false
        }
    }
}

/// Each contract test, once per backend.
macro_rules! contract {
    ($($name:ident),* $(,)?) => {
        mod memory {
            $( #[test] fn $name() { super::$name(&super::Memory::new()) } )*
        }
        mod sqlite {
            $( #[test] fn $name() { super::$name(&super::Sqlite::new()) } )*
        }
        #[cfg(feature = "redis")]
        mod redis {
            $( #[test] fn $name() {
                if let Some(server) = super::redis_server::Redis::start() {
                    super::$name(&server)
                }
            } )*
        }
    };
}

contract!(
    a_commit_reaches_every_other_handle,
    a_rollback_writes_nothing,
    appended_writes_reach_other_handles,
    the_feed_follows_on_from_a_load,
    usage_events_are_one_row_per_request_and_filtered,
    costs_travel_with_their_rows_and_leases,
    renewed_leases_count_again_even_after_a_sweep,
    many_rows_at_once_are_all_written,
    the_sweep_deletes_what_retention_no_longer_keeps,
    a_kept_tenant_keeps_its_own_rows_and_no_others,
    a_row_written_behind_the_last_sweep_goes_at_the_next,
    deletes_of_history_and_cooldowns_match_what_they_name,
    a_readonly_handle_refuses_every_write,
    an_optimistic_commit_conflicts_only_on_what_its_decision_read,
    quota_states_and_server_logs_read_back,
    an_observed_quota_reaches_others_and_conflicts_with_no_decision,
    changed_says_so_after_another_commit,
    the_write_lock_keeps_a_second_writer_out,
    claims_and_sole_writer,
    model_prices_are_set_replaced_and_forgotten,
    platform_limits_are_replaced_and_forgotten,
    tenants_travel_with_their_rows_and_leases,
    tenant_limits_are_set_replaced_and_forgotten,
    an_optimistic_lease_conflicts_on_a_shared_tenant,
);

// ---- rows -----------------------------------------------------------------------

fn usage(key_id: i64, kind: UsageKind, tokens: i64, count: i64, at: i64) -> UsageRow {
    UsageRow {
        platform: Arc::from("p"),
        model_id: Arc::from("m"),
        key_id,
        kind,
        tokens,
        count,
        created_at_ms: at,
        kinds: TokenKinds::default(),
        cost: 0,
        tenants: quotaengine::core::tenants::none(),
    }
}

fn request(key_id: i64, at: i64) -> Write {
    Write::Usage(usage(key_id, UsageKind::Request, 0, 1, at))
}

fn lease(id: i64, key_id: i64, expires: i64) -> LeaseRow {
    LeaseRow {
        id,
        platform: Arc::from("p"),
        model_id: Arc::from("m"),
        key_id,
        tokens: 100,
        output_tokens: 30,
        cost: 0,
        created_at_ms: T0,
        expires_at_ms: expires,
        tenants: quotaengine::core::tenants::none(),
    }
}

fn cooldown(key_id: i64, model: &str, expires: i64) -> CooldownRow {
    CooldownRow {
        platform: Arc::from("p"),
        model_id: Arc::from(model),
        key_id: Some(key_id),
        expires_at_ms: expires,
        source: CooldownSource::Authoritative,
        set_at_ms: T0,
    }
}

fn history(key_id: i64, model: &str, kind: HistoryKind, at: i64) -> HistoryRow {
    HistoryRow {
        platform: Arc::from("p"),
        model_id: Arc::from(model),
        key_id,
        kind,
        hit_at_ms: at,
        value: None,
    }
}

fn key(key_id: i64) -> KeyInfo {
    KeyInfo {
        key_id,
        platform: "p".into(),
        base_url: Some("http://localhost:1".into()),
        label: Some("k".into()),
        enabled: true,
        account: Some("acct".into()),
        concurrency_cap: Some(4),
    }
}

fn model() -> ModelInfo {
    ModelInfo {
        platform: "p".into(),
        model_id: "m".into(),
        limits: LimitSet::parse("requests/minute=10 requests/day=100 tokens/day=1000").unwrap(),
        monthly_token_budget: Some("5000".into()),
    }
}

/// An observed quota row (SPEC §8.2) of 100 with `remaining` left.
fn quota(platform: &str, key_id: i64, metric: &str, remaining: Option<i64>) -> QuotaStateRow {
    QuotaStateRow {
        platform: platform.into(),
        key_id,
        pool_key: "pool".into(),
        metric: metric.into(),
        limit: Some(100),
        remaining,
        reset_at_ms: Some(T0 + 60_000),
        source: "header".into(),
        confidence: 1.0,
        observed_at_ms: T0,
    }
}

fn log_row(message: &str, at: i64) -> LogRow {
    LogRow {
        level: "warn",
        source: "quotaengine".into(),
        provider: None,
        model: Some("m".into()),
        event: Some("degraded".into()),
        message: message.into(),
        created_at_ms: at,
    }
}

// ---- sections --------------------------------------------------------------------

/// Writes in one locked section; returns each write's result.
fn commit(s: &mut dyn Store, writes: &[Write]) -> Vec<i64> {
    s.begin(true).unwrap();
    let _ = s.pull().unwrap();
    let out = writes.iter().map(|w| s.write(w).unwrap()).collect();
    s.commit().unwrap();
    out
}

/// Starts following the store (the engine's start-up: a load, then pulls); returns
/// the usage rows loaded.
fn follow(s: &mut dyn Store, since: i64) -> Vec<UsageRow> {
    start(s, since).0
}

/// The engine's start-up read: the usage rows loaded, and the first pull.
fn start(s: &mut dyn Store, since: i64) -> (Vec<UsageRow>, Changes) {
    let mut rows = Vec::new();
    s.begin(false).unwrap();
    s.load_usage_since(since, &mut |r| rows.push(r)).unwrap();
    let ch = s.pull().unwrap();
    s.commit().unwrap();
    (rows, ch)
}

/// What a read section's pull brings.
fn pull(s: &mut dyn Store) -> Changes {
    s.begin(false).unwrap();
    let ch = s.pull().unwrap();
    s.commit().unwrap();
    ch
}

fn requests(rows: &[UsageRow]) -> i64 {
    rows.iter().map(UsageRow::requests).sum()
}

// ---- the contract ------------------------------------------------------------------

fn a_commit_reaches_every_other_handle(b: &dyn Backend) {
    let (mut a, mut r) = (b.open(), b.open());
    follow(&mut *r, 0);
    follow(&mut *a, 0);
    let ids = commit(
        &mut *a,
        &[
            request(1, T0),
            Write::Usage(UsageRow {
                kinds: TokenKinds { input: Some(70), output: Some(30), cached: Some(10) },
                ..usage(1, UsageKind::Tokens, 100, 1, T0)
            }),
            Write::InsertLease(lease(77, 1, T0 + 60_000)),
            Write::UpsertCooldown(cooldown(1, "m", T0 + 30_000)),
            Write::UpsertKey(key(1)),
            Write::UpsertModel(model()),
            Write::SetCaps("p".into(), [CapSetting::Cap(9), CapSetting::NoCap, CapSetting::Inherit]),
            Write::InsertHistory(history(1, "m", HistoryKind::Ladder, T0)),
            Write::SetCalendar { platform: "p".into(), zone: Some("America/Los_Angeles".into()) },
            Write::UpsertQuotaState(quota("p", 1, "requests", Some(40))),
        ],
    );
    assert_eq!(ids[2], 77, "an inserted lease answers its id");
    let ch = pull(&mut *r);
    assert_eq!(ch.usage.len(), 2);
    assert_eq!(requests(&ch.usage), 1);
    let tokens = ch.usage.iter().find(|u| u.kind == UsageKind::Tokens).unwrap();
    assert_eq!((tokens.tokens, tokens.kinds.input, tokens.kinds.cached), (100, Some(70), Some(10)));
    assert_eq!(ch.leases.unwrap(), vec![lease(77, 1, T0 + 60_000)]);
    assert_eq!(ch.cooldowns.unwrap(), vec![cooldown(1, "m", T0 + 30_000)]);
    assert_eq!(ch.keys.unwrap(), vec![key(1)]);
    assert_eq!(ch.models.unwrap(), vec![model()]);
    let caps = ch.caps.unwrap();
    assert_eq!(caps.len(), 1);
    assert_eq!((caps[0].1[0], caps[0].1[1]), (CapSetting::Cap(9), CapSetting::NoCap));
    assert_eq!(ch.history.unwrap(), vec![history(1, "m", HistoryKind::Ladder, T0)]);
    assert_eq!(ch.calendars.unwrap(), vec![("p".to_string(), "America/Los_Angeles".to_string())]);
    assert_eq!(ch.quota_states.unwrap(), vec![quota("p", 1, "requests", Some(40))]);
    // The writer is never handed its own usage rows back.
    assert!(pull(&mut *a).usage.is_empty());
    // Nothing new: nothing more for the reader.
    assert!(pull(&mut *r).usage.is_empty());
    // A handle opened later loads it all.
    let mut late = b.open();
    let (rows, ch) = start(&mut *late, 0);
    assert_eq!(rows.len(), 2);
    assert_eq!(ch.leases.unwrap().len(), 1);
    assert_eq!(ch.keys.unwrap(), vec![key(1)]);
    assert_eq!(ch.quota_states.unwrap().len(), 1);
}

/// SPEC 23.3: a platform's limits as declared, replaced whole, forgotten when empty;
/// every other handle reads the whole table when it changed.
fn platform_limits_are_replaced_and_forgotten(b: &dyn Backend) {
    let (mut a, mut r) = (b.open(), b.open());
    start(&mut *r, 0);
    let lim = |m: &str, n: i64, per: &str, scope: &str| Limit::parse(m, n, per, scope).unwrap();
    let set = |p: &str, limits: Vec<Limit>| Write::SetPlatformLimits { platform: p.into(), limits };
    let two = vec![lim("requests", 20, "minute", "account"), lim("tokens", 9, "month", "key")];
    commit(&mut *a, &[set("p", two.clone()), set("q\u{1f}x", vec![lim("requests", 1, "5h", "key")])]);
    let mut got = pull(&mut *r).platform_limits.expect("the table changed");
    got.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(
        got,
        vec![("p".to_string(), two), ("q\u{1f}x".to_string(), vec![lim("requests", 1, "5h", "key")])]
    );
    assert!(pull(&mut *r).platform_limits.is_none(), "unchanged: not read again");
    commit(&mut *a, &[set("p", vec![lim("output_tokens", 3, "day", "account")]), set("q\u{1f}x", vec![])]);
    let got = pull(&mut *r).platform_limits.expect("the table changed");
    assert_eq!(got, vec![("p".to_string(), vec![lim("output_tokens", 3, "day", "account")])]);
    // A handle opened later loads it.
    let mut late = b.open();
    let (_, ch) = start(&mut *late, 0);
    assert_eq!(ch.platform_limits.map(|p| p.len()), Some(1));
}

/// Tenants as a call names them (SPEC 23.2).
fn tenants(names: &[&str]) -> TenantList {
    names.iter().map(|n| Arc::from(*n)).collect()
}

/// SPEC 23.2: the tenants a usage row was served for and a lease is taken for reach
/// every other handle (the feed, a load, the leases) and `usage_events` exactly, in
/// the order given, whatever their names hold; every event of a merged row carries
/// them; rows without tenants stay without, beside them in one grouped insert.
fn tenants_travel_with_their_rows_and_leases(b: &dyn Backend) {
    let (mut a, mut r) = (b.open(), b.open());
    follow(&mut *r, 0);
    follow(&mut *a, 0);
    let odd = tenants(&["quote\"d", "back\\slash", "é🦀 中文", "a\u{1f}b\u{1e}c\n", "team:x"]);
    let two = tenants(&["user:a", "team:x"]);
    let with = |u: UsageRow, t: &TenantList| Write::Usage(UsageRow { tenants: t.clone(), ..u });
    let writes = vec![
        with(usage(1, UsageKind::Request, 0, 1, T0), &two),
        with(
            UsageRow {
                kinds: TokenKinds { input: Some(70), output: Some(30), cached: None },
                cost: 2_345,
                ..usage(1, UsageKind::Tokens, 100, 1, T0 + 1)
            },
            &odd,
        ),
        request(1, T0 + 2),
        // Forty requests merged while degraded: one grouped insert and single rows.
        with(usage(2, UsageKind::Request, 0, 40, T0 + 3), &two),
        Write::InsertLease(LeaseRow { tenants: odd.clone(), cost: 7, ..lease(5, 1, T0 + 60_000) }),
        Write::InsertLease(lease(6, 1, T0 + 60_000)),
        Write::InsertLease(LeaseRow { tenants: two.clone(), output_tokens: 0, ..lease(7, 1, T0 + 60_000) }),
    ];
    commit(&mut *a, &writes);
    // Many rows at once, some for tenants and some not (grouped inserts).
    let many: Vec<Write> = (0..100)
        .map(|i| {
            if i % 3 == 0 {
                request(3, T0 + 10 + i)
            } else {
                with(usage(3, UsageKind::Request, 0, 1, T0 + 10 + i), &odd)
            }
        })
        .collect();
    a.begin(true).unwrap();
    let _ = a.pull().unwrap();
    a.write_all(&many.iter().collect::<Vec<_>>()).unwrap();
    a.commit().unwrap();
    let expect = |rows: &[UsageRow]| {
        let of = |key: i64| rows.iter().filter(|u| u.key_id == key).collect::<Vec<_>>();
        let k1 = of(1);
        assert_eq!(k1.len(), 3, "{k1:?}");
        let req = k1.iter().find(|u| u.kind == UsageKind::Request && u.created_at_ms == T0).unwrap();
        assert_eq!(req.tenants, two);
        let tok = k1.iter().find(|u| u.kind == UsageKind::Tokens).unwrap();
        assert_eq!((&tok.tenants, tok.cost, tok.kinds.input), (&odd, 2_345, Some(70)));
        assert!(k1.iter().find(|u| u.created_at_ms == T0 + 2).unwrap().tenants.is_empty());
        let k2 = of(2);
        assert_eq!(k2.iter().map(|u| u.requests()).sum::<i64>(), 40);
        assert!(k2.iter().all(|u| u.tenants == two), "every event of a merged row");
        let k3 = of(3);
        assert_eq!(k3.len(), 100);
        for u in k3 {
            let want = if (u.created_at_ms - T0 - 10) % 3 == 0 { tenants(&[]) } else { odd.clone() };
            assert_eq!(u.tenants, want, "{u:?}");
        }
    };
    let ch = pull(&mut *r);
    expect(&ch.usage);
    let mut leases = ch.leases.unwrap();
    leases.sort_by_key(|l| l.id);
    assert_eq!(
        leases,
        vec![
            LeaseRow { tenants: odd.clone(), cost: 7, ..lease(5, 1, T0 + 60_000) },
            lease(6, 1, T0 + 60_000),
            LeaseRow { tenants: two.clone(), output_tokens: 0, ..lease(7, 1, T0 + 60_000) },
        ]
    );
    // One row per event, each with its tenants.
    let events = a.usage_events(&UsageFilter::default()).unwrap();
    assert_eq!(events.len(), 3 + 40 + 100);
    expect(&events);
    let k1 = a.usage_events(&UsageFilter { key_id: Some(1), ..UsageFilter::default() }).unwrap();
    assert_eq!(k1.iter().map(|u| u.tenants.len()).collect::<Vec<_>>(), vec![2, 5, 0]);
    // A handle opened later loads them too.
    let mut late = b.open();
    let (loaded, ch) = start(&mut *late, 0);
    expect(&loaded);
    let mut leases = ch.leases.unwrap();
    leases.sort_by_key(|l| l.id);
    assert_eq!(leases.iter().map(|l| l.tenants.clone()).collect::<Vec<_>>(), vec![odd, tenants(&[]), two]);
}

/// SPEC 23.2: a tenant's (or a pattern's) declaration with its zone, replaced whole,
/// forgotten when its limits are empty; every other handle reads the whole table when
/// it changed.
fn tenant_limits_are_set_replaced_and_forgotten(b: &dyn Backend) {
    let (mut a, mut r) = (b.open(), b.open());
    start(&mut *r, 0);
    let lim = |m: &str, n: i64, per: &str| Limit::parse(m, n, per, "account").unwrap();
    let set = |t: &str, limits: Vec<Limit>, tz: Option<&str>| {
        Write::SetTenantLimits(TenantLimitsRow { tenant: t.into(), limits, tz: tz.map(Into::into) })
    };
    let row = |t: &str, limits: Vec<Limit>, tz: Option<&str>| TenantLimitsRow {
        tenant: t.into(),
        limits,
        tz: tz.map(Into::into),
    };
    let sorted = |mut rows: Vec<TenantLimitsRow>| {
        rows.sort_by(|x, y| x.tenant.cmp(&y.tenant));
        rows
    };
    let budget = vec![lim("cost", 5_000_000, "day"), lim("requests", 100, "minute")];
    commit(
        &mut *a,
        &[
            set("*", vec![lim("requests", 10, "minute")], None),
            set("team:*", budget.clone(), Some("America/New_York")),
            set("user:\"a\u{1f}\\", vec![lim("tokens", 1_000, "month")], Some("Europe/Paris")),
        ],
    );
    assert_eq!(
        sorted(pull(&mut *r).tenant_limits.expect("the table changed")),
        vec![
            row("*", vec![lim("requests", 10, "minute")], None),
            row("team:*", budget.clone(), Some("America/New_York")),
            row("user:\"a\u{1f}\\", vec![lim("tokens", 1_000, "month")], Some("Europe/Paris")),
        ]
    );
    assert!(pull(&mut *r).tenant_limits.is_none(), "unchanged: not read again");
    // Replaced whole (its zone too), and forgotten.
    commit(
        &mut *a,
        &[set("team:*", vec![lim("output_tokens", 3, "week")], None), set("*", vec![], Some("Asia/Tokyo"))],
    );
    assert_eq!(
        sorted(pull(&mut *r).tenant_limits.expect("the table changed")),
        vec![
            row("team:*", vec![lim("output_tokens", 3, "week")], None),
            row("user:\"a\u{1f}\\", vec![lim("tokens", 1_000, "month")], Some("Europe/Paris")),
        ]
    );
    // A handle opened later loads it.
    let mut late = b.open();
    let (_, ch) = start(&mut *late, 0);
    assert_eq!(ch.tenant_limits.map(|t| t.len()), Some(2));
}

/// SPEC 23.2 (the one atomic admission): an optimistic lease commit conflicts when
/// another handle, since what it read, recorded usage or inserted a lease naming one
/// of its leases' tenants, on any account; tenants it does not name do not touch it.
/// A store whose sections hold the write lock cannot conflict.
fn an_optimistic_lease_conflicts_on_a_shared_tenant(b: &dyn Backend) {
    let (mut a, mut other) = (b.open(), b.open());
    follow(&mut *a, 0);
    follow(&mut *other, 0);
    let for_tenants = |id: i64, t: &[&str]| {
        Write::InsertLease(LeaseRow { tenants: tenants(t), ..lease(id, 1, T0 + 60_000) })
    };
    let used_by = |key: i64, at: i64, t: &[&str]| {
        Write::Usage(UsageRow { tenants: tenants(t), ..usage(key, UsageKind::Request, 0, 1, at) })
    };
    // Another handle records usage for team:x on another key (another account).
    commit(&mut *other, &[used_by(2, T0, &["user:b", "team:x"])]);
    let optimistic = a.begin_optimistic().unwrap();
    if !optimistic {
        let _ = a.pull().unwrap();
        a.write(&for_tenants(9, &["user:a", "team:x"])).unwrap();
        a.commit().unwrap();
        assert_eq!(pull(&mut *other).leases.unwrap()[0].tenants, tenants(&["user:a", "team:x"]));
        return;
    }
    let _ = a.pull().unwrap();
    a.write(&for_tenants(9, &["user:a", "team:x"])).unwrap();
    assert!(matches!(a.commit(), Err(StoreError::Conflict)));
    assert!(pull(&mut *other).leases.unwrap_or_default().is_empty(), "nothing was written");
    assert_eq!(pull(&mut *a).usage[0].tenants, tenants(&["user:b", "team:x"]));
    // Decided again on what it now knows: no conflict.
    assert!(a.begin_optimistic().unwrap());
    a.write(&for_tenants(9, &["user:a", "team:x"])).unwrap();
    a.commit().unwrap();
    // Disjoint tenants on another account meanwhile do not touch the decision, nor
    // does a lease for no tenant.
    let _ = pull(&mut *a);
    commit(
        &mut *other,
        &[used_by(2, T0 + 1, &["user:b", "team:y"]), used_by(3, T0 + 1, &["user:a:x", "team:x "])],
    );
    assert!(a.begin_optimistic().unwrap());
    a.write(&for_tenants(10, &["user:a", "team:x"])).unwrap();
    a.commit().unwrap();
    let _ = pull(&mut *a);
    commit(&mut *other, &[used_by(2, T0 + 2, &["team:x"])]);
    assert!(a.begin_optimistic().unwrap());
    a.write(&Write::InsertLease(lease(11, 1, T0 + 60_000))).unwrap();
    a.commit().unwrap();
    // Another handle's lease for user:a (a name with separators in it too) conflicts.
    let _ = pull(&mut *a);
    let odd = "user:a\u{1e}\u{1f}\\r";
    commit(
        &mut *other,
        &[Write::InsertLease(LeaseRow { tenants: tenants(&["x", odd]), ..lease(20, 3, T0 + 60_000) })],
    );
    assert!(a.begin_optimistic().unwrap());
    a.write(&for_tenants(12, &[odd])).unwrap();
    assert!(matches!(a.commit(), Err(StoreError::Conflict)));
    // But not a lease whose names only look alike once escaped.
    let _ = pull(&mut *a);
    commit(
        &mut *other,
        &[Write::InsertLease(LeaseRow { tenants: tenants(&["user:a\u{1e}"]), ..lease(21, 3, T0 + 60_000) })],
    );
    assert!(a.begin_optimistic().unwrap());
    a.write(&for_tenants(13, &["user:a\\r", "user:a"])).unwrap();
    a.commit().unwrap();
    // Its own usage for the tenant never conflicts with its own decision.
    let _ = pull(&mut *a);
    commit(&mut *a, &[used_by(1, T0 + 3, &["user:a"])]);
    assert!(a.begin_optimistic().unwrap());
    a.write(&for_tenants(14, &["user:a"])).unwrap();
    a.commit().unwrap();
    let mut late = b.open();
    let mut ids: Vec<i64> = start(&mut *late, 0).1.leases.unwrap().iter().map(|l| l.id).collect();
    ids.sort_unstable();
    assert_eq!(ids, vec![9, 10, 11, 13, 14, 20, 21]);
}

fn a_rollback_writes_nothing(b: &dyn Backend) {
    let (mut a, mut r) = (b.open(), b.open());
    follow(&mut *r, 0);
    a.begin(true).unwrap();
    let _ = a.pull().unwrap();
    a.write(&request(1, T0)).unwrap();
    a.write(&Write::InsertLease(lease(5, 1, T0 + 60_000))).unwrap();
    a.write(&Write::UpsertCooldown(cooldown(1, "m", T0 + 1))).unwrap();
    a.rollback();
    let ch = pull(&mut *r);
    assert!(ch.usage.is_empty());
    assert!(ch.leases.unwrap_or_default().is_empty());
    assert!(ch.cooldowns.unwrap_or_default().is_empty());
    // The abandoned section's writer goes on as before.
    commit(&mut *a, &[request(2, T0)]);
    assert_eq!(pull(&mut *r).usage.iter().map(|u| u.key_id).collect::<Vec<_>>(), vec![2]);
}

fn appended_writes_reach_other_handles(b: &dyn Backend) {
    let (mut a, mut r) = (b.open(), b.open());
    follow(&mut *r, 0);
    follow(&mut *a, 0);
    commit(&mut *a, &[Write::InsertLease(lease(5, 1, T0 + 60_000))]);
    assert_eq!(pull(&mut *r).leases.unwrap().len(), 1);
    a.begin_append().unwrap();
    let _ = a.pull().unwrap();
    a.write(&request(1, T0)).unwrap();
    a.write(&Write::DeleteLease(5)).unwrap();
    a.commit().unwrap();
    let ch = pull(&mut *r);
    assert_eq!(requests(&ch.usage), 1);
    assert_eq!(ch.leases.unwrap(), Vec::<LeaseRow>::new());
    // An append with nothing to write is a commit of nothing.
    a.begin_append().unwrap();
    a.commit().unwrap();
    assert!(pull(&mut *r).usage.is_empty());
}

fn the_feed_follows_on_from_a_load(b: &dyn Backend) {
    let mut a = b.open();
    follow(&mut *a, 0);
    commit(&mut *a, &[request(1, T0 + 1_000), request(2, T0 + 2_000), request(3, T0 + 3_000)]);
    let mut r = b.open();
    let loaded = follow(&mut *r, T0 + 2_000);
    assert_eq!(
        loaded.iter().map(|u| u.key_id).collect::<Vec<_>>(),
        vec![2, 3],
        "rows stamped from the time on"
    );
    commit(&mut *a, &[request(4, T0 + 4_000)]);
    // Rows stamped before the load's time still come through the feed when new.
    commit(&mut *a, &[request(5, T0)]);
    let ch = pull(&mut *r);
    assert_eq!(ch.usage.iter().map(|u| u.key_id).collect::<Vec<_>>(), vec![4, 5]);
}

fn usage_events_are_one_row_per_request_and_filtered(b: &dyn Backend) {
    let mut a = b.open();
    follow(&mut *a, 0);
    commit(
        &mut *a,
        &[
            // Three requests merged while degraded: three events.
            Write::Usage(usage(1, UsageKind::Request, 0, 3, T0 + 10)),
            Write::Usage(usage(1, UsageKind::Tokens, 250, 1, T0 + 20)),
            request(2, T0 + 30),
        ],
    );
    let all = a.usage_events(&UsageFilter::default()).unwrap();
    assert_eq!(all.len(), 5);
    assert!(all.iter().all(|u| u.count == 1));
    assert!(all.windows(2).all(|w| w[0].created_at_ms <= w[1].created_at_ms), "in time order");
    let of_key = |k| UsageFilter { key_id: Some(k), ..UsageFilter::default() };
    assert_eq!(a.usage_events(&of_key(1)).unwrap().len(), 4);
    let timed = UsageFilter { since_ms: Some(T0 + 20), until_ms: Some(T0 + 30), ..UsageFilter::default() };
    let rows = a.usage_events(&timed).unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!((rows[0].kind, rows[0].tokens), (UsageKind::Tokens, 250));
    let other = UsageFilter { platform: Some("q".into()), ..UsageFilter::default() };
    assert!(a.usage_events(&other).unwrap().is_empty());
    let model = UsageFilter { model_id: Some("m".into()), key_id: Some(2), ..UsageFilter::default() };
    assert_eq!(a.usage_events(&model).unwrap().len(), 1);
}

/// SPEC 23.1: what an event cost and what a lease reserves (µ$) reach every other
/// handle and read back; a request row merged while degraded keeps its cost once, on
/// its first event; many priced rows at once (the grouped insert) keep theirs.
fn costs_travel_with_their_rows_and_leases(b: &dyn Backend) {
    let (mut a, mut r) = (b.open(), b.open());
    follow(&mut *r, 0);
    follow(&mut *a, 0);
    let priced = |u: UsageRow, cost: i64| Write::Usage(UsageRow { cost, ..u });
    let mut writes = vec![
        priced(usage(1, UsageKind::Request, 0, 1, T0), 150),
        priced(
            UsageRow {
                kinds: TokenKinds { input: Some(70), output: Some(30), cached: None },
                ..usage(1, UsageKind::Tokens, 100, 1, T0)
            },
            2_345,
        ),
        priced(usage(1, UsageKind::Tokens, 40, 1, T0 + 1), 7),
        // Three requests merged while degraded, 9 µ$ in all.
        priced(usage(2, UsageKind::Request, 0, 3, T0 + 2), 9),
        Write::InsertLease(LeaseRow { cost: 1_234, ..lease(5, 1, T0 + 60_000) }),
        Write::InsertLease(LeaseRow { cost: 11, output_tokens: 0, ..lease(6, 1, T0 + 60_000) }),
    ];
    // Enough priced requests for the grouped insert.
    writes.extend((0..300).map(|i| priced(usage(3, UsageKind::Request, 0, 1, T0 + 3 + i), 1)));
    commit(&mut *a, &writes);
    let ch = pull(&mut *r);
    let cost_of =
        |rows: &[UsageRow], key: i64| rows.iter().filter(|u| u.key_id == key).map(|u| u.cost).sum::<i64>();
    assert_eq!(cost_of(&ch.usage, 1), 150 + 2_345 + 7);
    assert_eq!(cost_of(&ch.usage, 2), 9);
    assert_eq!(cost_of(&ch.usage, 3), 300);
    let mut leases = ch.leases.unwrap();
    leases.sort_by_key(|l| l.id);
    assert_eq!(leases.iter().map(|l| (l.id, l.cost)).collect::<Vec<_>>(), vec![(5, 1_234), (6, 11)]);
    assert_eq!(leases[1].output_tokens, 0);
    let events = a.usage_events(&UsageFilter { key_id: Some(2), ..UsageFilter::default() }).unwrap();
    assert_eq!(events.iter().map(|u| u.cost).collect::<Vec<_>>(), vec![9, 0, 0]);
    let events = a.usage_events(&UsageFilter { key_id: Some(1), ..UsageFilter::default() }).unwrap();
    let tokens = events.iter().find(|u| u.tokens == 100).unwrap();
    assert_eq!((tokens.cost, tokens.kinds.input, tokens.kinds.output), (2_345, Some(70), Some(30)));
    // A handle opened later loads the costs too.
    let mut late = b.open();
    let loaded = follow(&mut *late, 0);
    assert_eq!(cost_of(&loaded, 1) + cost_of(&loaded, 2) + cost_of(&loaded, 3), 150 + 2_345 + 7 + 9 + 300);
}

/// SPEC 24.1: a renewal writes each lease whole with its new expiry: a live one is
/// updated, one a sweep took after its max age is written again; others see both.
fn renewed_leases_count_again_even_after_a_sweep(b: &dyn Backend) {
    let (mut a, mut r) = (b.open(), b.open());
    follow(&mut *r, 0);
    follow(&mut *a, 0);
    commit(&mut *a, &[Write::InsertLease(lease(5, 1, T0 + 10)), Write::InsertLease(lease(6, 1, T0 + 10))]);
    let expiries = |ch: Changes| {
        let mut l: Vec<(i64, i64)> = ch.leases.unwrap().iter().map(|l| (l.id, l.expires_at_ms)).collect();
        l.sort_unstable();
        l
    };
    assert_eq!(expiries(pull(&mut *r)), vec![(5, T0 + 10), (6, T0 + 10)]);
    let sweep = Write::Sweep {
        usage_before: 0,
        kept: Vec::new().into(),
        leases_expired_before: T0 + 20,
        history_before: 0,
    };
    commit(&mut *r, &[sweep]);
    assert_eq!(expiries(pull(&mut *a)), vec![]);
    let renewed = vec![LeaseRow { expires_at_ms: T0 + 500, ..lease(5, 1, T0 + 10) }];
    commit(&mut *a, &[Write::RenewLeases(renewed)]);
    assert_eq!(expiries(pull(&mut *r)), vec![(5, T0 + 500)]);
    let renewed = vec![LeaseRow { expires_at_ms: T0 + 900, ..lease(5, 1, T0 + 10) }];
    commit(&mut *a, &[Write::RenewLeases(renewed)]);
    assert_eq!(expiries(pull(&mut *r)), vec![(5, T0 + 900)]);
}

fn many_rows_at_once_are_all_written(b: &dyn Backend) {
    let (mut a, mut r) = (b.open(), b.open());
    follow(&mut *r, 0);
    let writes: Vec<Write> = (0..75).map(|i| request(1, T0 + i)).collect();
    let refs: Vec<&Write> = writes.iter().collect();
    a.begin(true).unwrap();
    let _ = a.pull().unwrap();
    a.write_all(&refs).unwrap();
    a.write(&Write::Usage(usage(1, UsageKind::Request, 0, 40, T0 + 100))).unwrap();
    a.commit().unwrap();
    assert_eq!(requests(&pull(&mut *r).usage), 115);
}

fn the_sweep_deletes_what_retention_no_longer_keeps(b: &dyn Backend) {
    let (mut a, mut r) = (b.open(), b.open());
    follow(&mut *a, 0);
    commit(
        &mut *a,
        &[
            request(1, T0 - 2_000),
            request(1, T0 + 5),
            Write::InsertLease(lease(1, 1, T0 - 1)),
            Write::InsertLease(lease(2, 1, T0)),
            Write::InsertHistory(history(1, "m", HistoryKind::Ladder, T0 - 10)),
            Write::InsertHistory(history(1, "m", HistoryKind::Unknown, T0 + 10)),
            // SPEC 24.2: a learned concurrency cap is never forgotten, whatever its age.
            Write::InsertHistory(HistoryRow {
                value: Some(2),
                ..history(1, "", HistoryKind::Concurrency, T0 - 3 * 86_400_000)
            }),
        ],
    );
    commit(
        &mut *a,
        &[Write::Sweep {
            usage_before: T0,
            kept: Vec::new().into(),
            leases_expired_before: T0,
            history_before: T0,
        }],
    );
    let (left, ch) = start(&mut *r, 0);
    assert_eq!(left.iter().map(|u| u.created_at_ms).collect::<Vec<_>>(), vec![T0 + 5]);
    // A lease counts up to and including its expiry.
    assert_eq!(ch.leases.unwrap().iter().map(|l| l.id).collect::<Vec<_>>(), vec![2]);
    let mut kept = ch.history.unwrap();
    kept.sort_by_key(|h| h.hit_at_ms);
    assert_eq!(
        kept,
        vec![
            HistoryRow { value: Some(2), ..history(1, "", HistoryKind::Concurrency, T0 - 3 * 86_400_000) },
            history(1, "m", HistoryKind::Unknown, T0 + 10)
        ]
    );
    assert_eq!(a.usage_events(&UsageFilter::default()).unwrap().len(), 1);
}

/// SPEC 24.3: a tenant's calendar limit keeps the rows carrying the tenant, of any
/// model, and no others; a row goes when every cut-off that applies to it (its model's,
/// each kept tenant's it carries, or `usage_before`) has passed it, whichever class of
/// the sweep comes to it first.
fn a_kept_tenant_keeps_its_own_rows_and_no_others(b: &dyn Backend) {
    const DAY: i64 = 86_400_000;
    let (mut a, mut r) = (b.open(), b.open());
    follow(&mut *a, 0);
    let odd = "x\u{1e}\"y\\z";
    let row = |model: &str, t: &[&str], at: i64| {
        Write::Usage(UsageRow {
            model_id: Arc::from(model),
            tenants: tenants(t),
            ..usage(1, UsageKind::Request, 0, 1, at)
        })
    };
    commit(
        &mut *a,
        &[
            row("m", &[], T0 - DAY),         // 0: gone
            row("m", &["t"], T0 - DAY),      // 1: t's
            row("m", &["u"], T0 - DAY),      // 2: gone (u keeps nothing)
            row("m", &["u", "t"], T0 - DAY), // 3: t's
            row("m", &["t"], T0 - 20 * DAY), // 4: gone (older than t's month)
            row("k", &[], T0 - DAY),         // 5: k's
            row("k", &["t"], T0 - 7 * DAY),  // 6: t's (older than k's cut-off)
            row("k", &["u"], T0 - 7 * DAY),  // 7: gone
            row("m", &[odd], T0 - DAY),      // 8: the odd tenant's
            row("m", &[], T0 + 5),           // 9: young
        ],
    );
    let sweep = |t_before: i64| Write::Sweep {
        usage_before: T0,
        kept: vec![
            KeptUsage::model(Arc::from("p"), Arc::from("k"), T0 - 5 * DAY),
            KeptUsage::tenant(Arc::from("t"), t_before),
            KeptUsage::tenant(Arc::from(odd), T0 - 2 * DAY),
        ]
        .into(),
        leases_expired_before: T0,
        history_before: T0,
    };
    let left = |s: &mut dyn Store| {
        let mut v: Vec<(String, Vec<String>, i64)> = s
            .usage_events(&UsageFilter::default())
            .unwrap()
            .iter()
            .map(|u| {
                (
                    u.model_id.to_string(),
                    u.tenants.iter().map(|t| t.to_string()).collect(),
                    (u.created_at_ms - T0) / DAY,
                )
            })
            .collect();
        v.sort();
        v
    };
    let names = |m: &str, t: &[&str], days: i64| {
        (m.to_string(), t.iter().map(|x| x.to_string()).collect::<Vec<_>>(), days)
    };
    commit(&mut *a, &[sweep(T0 - 10 * DAY)]);
    assert_eq!(
        left(&mut *r),
        vec![
            names("k", &[], -1),
            names("k", &["t"], -7),
            names("m", &[], 0),
            names("m", &["t"], -1),
            names("m", &["u", "t"], -1),
            names("m", &[odd], -1),
        ]
    );
    // t's period moved on: its rows go too, the one of k older than k's cut-off included.
    commit(&mut *a, &[sweep(T0 - 3_600_000)]);
    assert_eq!(left(&mut *r), vec![names("k", &[], -1), names("m", &[], 0), names("m", &[odd], -1)]);
    // The loaded rows are the ones left.
    assert_eq!(start(&mut *r, 0).0.len(), 3);
}

/// SPEC 24.3: a row stamped before where the last sweep got to (written by a clock
/// behind the sweeper's) goes at the next sweep whose cut-off passes it, also while a
/// kept model makes the sweep go class by class.
fn a_row_written_behind_the_last_sweep_goes_at_the_next(b: &dyn Backend) {
    const HOUR: i64 = 3_600_000;
    let (mut a, mut other) = (b.open(), b.open());
    follow(&mut *a, 0);
    follow(&mut *other, 0);
    let sweep = |before: i64| Write::Sweep {
        usage_before: before,
        kept: vec![KeptUsage::model(Arc::from("p"), Arc::from("k"), T0 - 24 * HOUR)].into(),
        leases_expired_before: 0,
        history_before: 0,
    };
    commit(&mut *a, &[request(1, T0 + 3 * HOUR)]);
    commit(&mut *a, &[sweep(T0 + 2 * HOUR)]);
    let _ = pull(&mut *other);
    commit(&mut *other, &[request(1, T0 + 30_000)]); // 3 h behind
    commit(&mut *other, &[sweep(T0 + HOUR + 60_000)]);
    let left: Vec<i64> =
        a.usage_events(&UsageFilter::default()).unwrap().iter().map(|u| u.created_at_ms).collect();
    assert_eq!(left, vec![T0 + 3 * HOUR]);
}

fn deletes_of_history_and_cooldowns_match_what_they_name(b: &dyn Backend) {
    let (mut a, mut r) = (b.open(), b.open());
    commit(
        &mut *a,
        &[
            Write::InsertHistory(history(1, "m", HistoryKind::Ladder, T0)),
            Write::InsertHistory(history(1, "n", HistoryKind::Ladder, T0)),
            Write::InsertHistory(history(1, "m", HistoryKind::Empty, T0)),
            Write::InsertHistory(history(1, "", HistoryKind::Auth, T0)),
            Write::InsertHistory(history(2, "m", HistoryKind::Ladder, T0)),
            Write::InsertHistory(HistoryRow {
                value: Some(3),
                ..history(1, "", HistoryKind::Concurrency, T0)
            }),
            Write::UpsertCooldown(cooldown(1, "m", T0 + 10)),
            Write::UpsertCooldown(cooldown(1, "n", T0 + 20)),
            Write::UpsertCooldown(cooldown(2, "m", T0 + 5)),
            Write::UpsertCooldown(cooldown(3, "m", T0 + 50)),
        ],
    );
    commit(
        &mut *a,
        &[
            Write::DeleteHistory {
                key_id: 1,
                route: Some((Arc::from("p"), Arc::from("m"))),
                kinds: vec![HistoryKind::Ladder, HistoryKind::Empty],
            },
            Write::DeleteHistory { key_id: 1, route: None, kinds: vec![HistoryKind::Auth] },
            Write::DeleteCooldownsForKey(1),
            Write::DeleteExpiredCooldowns(T0 + 5),
        ],
    );
    let ch = pull(&mut *r);
    let mut hist: Vec<(i64, String, HistoryKind, Option<i64>)> = ch
        .history
        .unwrap()
        .into_iter()
        .map(|h| (h.key_id, h.model_id.to_string(), h.kind, h.value))
        .collect();
    hist.sort_by_key(|h| (h.0, h.1.clone(), h.2.as_str()));
    assert_eq!(
        hist,
        vec![
            (1, String::new(), HistoryKind::Concurrency, Some(3)),
            (1, "n".into(), HistoryKind::Ladder, None),
            (2, "m".into(), HistoryKind::Ladder, None),
        ]
    );
    assert_eq!(ch.cooldowns.unwrap(), vec![cooldown(3, "m", T0 + 50)]);
    commit(
        &mut *a,
        &[
            Write::DeleteCooldown { platform: Arc::from("p"), model_id: Arc::from("m"), key_id: 3 },
            Write::ResetCaps("p".into()),
            Write::SetCalendar { platform: "p".into(), zone: None },
        ],
    );
    assert_eq!(pull(&mut *r).cooldowns.unwrap_or_default(), Vec::<CooldownRow>::new());
}

fn a_readonly_handle_refuses_every_write(b: &dyn Backend) {
    let mut a = b.open();
    commit(&mut *a, &[request(1, T0), Write::UpsertKey(key(1))]);
    let mut ro = b.open_readonly();
    assert!(ro.readonly());
    assert!(matches!(ro.begin(true), Err(StoreError::ReadOnly)));
    assert!(matches!(ro.begin_append(), Err(StoreError::ReadOnly)));
    assert!(matches!(ro.begin_optimistic(), Err(StoreError::ReadOnly)));
    assert!(matches!(ro.write(&request(1, T0)), Err(StoreError::ReadOnly)));
    // It reads.
    let (rows, ch) = start(&mut *ro, 0);
    assert_eq!(rows.len(), 1);
    assert_eq!(ch.keys.unwrap(), vec![key(1)]);
    assert_eq!(ro.usage_events(&UsageFilter::default()).unwrap().len(), 1);
}

fn an_optimistic_commit_conflicts_only_on_what_its_decision_read(b: &dyn Backend) {
    let (mut a, mut other) = (b.open(), b.open());
    follow(&mut *a, 0);
    follow(&mut *other, 0);
    // Another handle records usage on key 1's account after `a` last read.
    commit(&mut *other, &[request(1, T0)]);
    let optimistic = a.begin_optimistic().unwrap();
    if !optimistic {
        // The section holds the write lock: what it decides on cannot be stale.
        let _ = a.pull().unwrap();
        a.write(&Write::InsertLease(lease(9, 1, T0 + 60_000))).unwrap();
        a.commit().unwrap();
        assert_eq!(pull(&mut *other).leases.unwrap().len(), 1);
        return;
    }
    let _ = a.pull().unwrap();
    assert_eq!(a.write(&Write::InsertLease(lease(9, 1, T0 + 60_000))).unwrap(), 9);
    assert!(matches!(a.commit(), Err(StoreError::Conflict)));
    // Nothing was written, and what changed is `a`'s next pull.
    assert!(pull(&mut *other).leases.unwrap_or_default().is_empty());
    let ch = pull(&mut *a);
    assert_eq!(requests(&ch.usage), 1);
    // Decided again on what it now knows: no conflict.
    assert!(a.begin_optimistic().unwrap());
    let _ = a.pull().unwrap();
    a.write(&Write::InsertLease(lease(9, 1, T0 + 60_000))).unwrap();
    a.commit().unwrap();
    assert_eq!(pull(&mut *other).leases.unwrap().iter().map(|l| l.id).collect::<Vec<_>>(), vec![9]);
    // Usage on another account meanwhile does not touch this decision...
    let _ = pull(&mut *a);
    commit(&mut *other, &[request(2, T0 + 1)]);
    assert!(a.begin_optimistic().unwrap());
    a.write(&Write::InsertLease(lease(10, 1, T0 + 60_000))).unwrap();
    a.commit().unwrap();
    // ...unless the decision watched that key too (a shared account).
    let _ = pull(&mut *a);
    commit(&mut *other, &[request(2, T0 + 2)]);
    assert!(a.begin_optimistic().unwrap());
    a.watch_keys("p", &[1, 2]);
    a.write(&Write::InsertLease(lease(11, 1, T0 + 60_000))).unwrap();
    assert!(matches!(a.commit(), Err(StoreError::Conflict)));
    // And a change to a small table conflicts with any decision.
    let _ = pull(&mut *a);
    commit(&mut *other, &[Write::UpsertCooldown(cooldown(1, "m", T0 + 9))]);
    assert!(a.begin_optimistic().unwrap());
    a.write(&Write::InsertLease(lease(12, 1, T0 + 60_000))).unwrap();
    assert!(matches!(a.commit(), Err(StoreError::Conflict)));
    let mut late = b.open();
    let ids: Vec<i64> = start(&mut *late, 0).1.leases.unwrap().iter().map(|l| l.id).collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(ids.contains(&9) && ids.contains(&10), "{ids:?}");
}

fn quota_states_and_server_logs_read_back(b: &dyn Backend) {
    let mut a = b.open();
    let q = quota;
    commit(
        &mut *a,
        &[
            Write::UpsertQuotaState(q("p", 2, "tokens", Some(5))),
            Write::UpsertQuotaState(q("p", 1, "requests", Some(50))),
            Write::UpsertQuotaState(q("o", 1, "requests", None)),
            // The same row again: the last value stays.
            Write::UpsertQuotaState(q("p", 1, "requests", Some(40))),
            Write::Log(log_row("first", T0)),
            Write::Log(log_row("second", T0 + 1)),
            Write::Log(log_row("third", T0 + 2)),
        ],
    );
    let all = a.quota_states(None).unwrap();
    assert_eq!(
        all,
        vec![q("o", 1, "requests", None), q("p", 1, "requests", Some(40)), q("p", 2, "tokens", Some(5))]
    );
    assert_eq!(a.quota_states(Some("p")).unwrap().len(), 2);
    let logs = a.server_logs(2).unwrap();
    assert_eq!(logs.iter().map(|(_, l, _)| l.message.as_str()).collect::<Vec<_>>(), vec!["third", "second"]);
    assert_eq!(logs[0].1, log_row("third", T0 + 2));
    assert!(logs[0].0 != logs[1].0, "rows have ids of their own");
}

fn an_observed_quota_reaches_others_and_conflicts_with_no_decision(b: &dyn Backend) {
    let (mut a, mut other) = (b.open(), b.open());
    follow(&mut *a, 0);
    follow(&mut *other, 0);
    commit(&mut *other, &[Write::UpsertQuotaState(quota("p", 2, "requests", Some(5)))]);
    // Merged again: the whole table, as it is now, in (platform, key, pool, metric) order.
    commit(
        &mut *other,
        &[
            Write::UpsertQuotaState(quota("p", 2, "requests", Some(4))),
            Write::UpsertQuotaState(quota("p", 1, "tokens", None)),
        ],
    );
    let ch = pull(&mut *a);
    assert_eq!(
        ch.quota_states.unwrap(),
        vec![quota("p", 1, "tokens", None), quota("p", 2, "requests", Some(4))]
    );
    assert!(pull(&mut *a).quota_states.is_none(), "unchanged: not read again");
    // The `headroom` pick may read it up to 5 s old (SPEC §8.2): it conflicts with no
    // optimistic decision, and is the next pull's.
    commit(&mut *other, &[Write::UpsertQuotaState(quota("p", 1, "requests", Some(9)))]);
    let optimistic = a.begin_optimistic().unwrap();
    // A section holding the write lock reads what changed first.
    let seen = if optimistic { None } else { a.pull().unwrap().quota_states };
    a.write(&Write::InsertLease(lease(9, 1, T0 + 60_000))).unwrap();
    a.commit().unwrap();
    assert_eq!(seen.or_else(|| pull(&mut *a).quota_states).unwrap().len(), 3);
}

fn changed_says_so_after_another_commit(b: &dyn Backend) {
    let (mut a, mut r) = (b.open(), b.open());
    assert!(r.changed().unwrap(), "nothing was read yet");
    follow(&mut *r, 0);
    commit(&mut *a, &[request(1, T0)]);
    assert!(r.changed().unwrap());
    assert_eq!(requests(&pull(&mut *r).usage), 1);
    commit(&mut *a, &[Write::UpsertKey(key(1))]);
    assert!(r.changed().unwrap());
}

fn the_write_lock_keeps_a_second_writer_out(b: &dyn Backend) {
    let (mut a, mut other) = (b.open(), b.open());
    a.begin(true).unwrap();
    let _ = a.pull().unwrap();
    other.set_busy_timeout(0);
    assert!(matches!(other.begin(true), Err(StoreError::Unavailable(_))));
    other.rollback();
    a.write(&request(1, T0)).unwrap();
    a.commit().unwrap();
    other.begin(true).unwrap();
    other.commit().unwrap();
}

fn claims_and_sole_writer(b: &dyn Backend) {
    let mut a = b.open();
    assert!(a.try_claim("probe:1", 60_000).unwrap());
    assert!(a.try_claim("probe:1", 60_000).unwrap(), "re-entrant for the holder");
    let mut other = b.open();
    assert_eq!(other.try_claim("probe:1", 60_000).unwrap(), !b.claims_are_shared());
    assert!(other.try_claim("probe:2", 60_000).unwrap());
    // Alone on the store: only a store that can tell says so.
    assert!(!a.sole_writer() && !other.sole_writer(), "two writers are open");
    drop(other);
    assert_eq!(a.sole_writer(), b.knows_sole_writer());
    // A read-only handle is not a writer.
    let _ro = b.open_readonly();
    assert_eq!(a.sole_writer(), b.knows_sole_writer());
}

/// SPEC 23.1: a model's prices reach every other handle (and one opened later) exactly,
/// as integers of p$; setting them again replaces them, `None` forgets them, and a
/// change to them is a change to a small table (an optimistic decision conflicts).
fn model_prices_are_set_replaced_and_forgotten(b: &dyn Backend) {
    let (mut a, mut r) = (b.open(), b.open());
    follow(&mut *r, 0);
    follow(&mut *a, 0);
    let big = Prices { input: i64::MAX, output: 0, cached_input: 1, per_request: i64::MAX - 1 };
    let set = |platform: &str, model_id: &str, prices: Option<Prices>| Write::SetModelPrices {
        platform: platform.into(),
        model_id: model_id.into(),
        prices,
    };
    commit(
        &mut *a,
        &[
            set("p", "m", Some(PRICES)),
            set("p", "n", Some(big)),
            // Names holding the separators of a Redis value stay apart.
            set("p\u{1f}q", "m\\", Some(PRICES)),
        ],
    );
    assert!(r.changed().unwrap());
    let mut rows = pull(&mut *r).prices.unwrap();
    rows.sort_by(|x, y| (&x.0, &x.1).cmp(&(&y.0, &y.1)));
    assert_eq!(
        rows,
        vec![
            ("p".to_string(), "m".to_string(), PRICES),
            ("p".to_string(), "n".to_string(), big),
            ("p\u{1f}q".to_string(), "m\\".to_string(), PRICES),
        ]
    );
    // Nothing new: nothing more.
    assert!(pull(&mut *r).prices.is_none());
    // Replaced, and forgotten.
    let cheaper = Prices { input: 1, ..PRICES };
    commit(&mut *a, &[set("p", "m", Some(cheaper)), set("p", "n", None)]);
    let mut rows = pull(&mut *r).prices.unwrap();
    rows.sort_by(|x, y| (&x.0, &x.1).cmp(&(&y.0, &y.1)));
    assert_eq!(
        rows,
        vec![
            ("p".to_string(), "m".to_string(), cheaper),
            ("p\u{1f}q".to_string(), "m\\".to_string(), PRICES)
        ]
    );
    // A handle opened later loads them.
    let mut late = b.open();
    assert_eq!(start(&mut *late, 0).1.prices.unwrap().len(), 2);
    // A change to prices conflicts with an optimistic decision, as any small table's.
    let _ = pull(&mut *a);
    commit(&mut *r, &[set("p", "m", None)]);
    if a.begin_optimistic().unwrap() {
        a.write(&Write::InsertLease(lease(12, 1, T0 + 60_000))).unwrap();
        assert!(matches!(a.commit(), Err(StoreError::Conflict)));
    } else {
        a.rollback();
    }
    assert_eq!(pull(&mut *a).prices.unwrap(), vec![("p\u{1f}q".to_string(), "m\\".to_string(), PRICES)]);
}

const PRICES: Prices =
    Prices { input: 150_000, output: 600_000, cached_input: 75_000, per_request: 2_000_000_000 };

/// Built without the Redis backend, a Redis URL is refused at open, not taken for the
/// name of a SQLite file.
#[cfg(not(feature = "redis"))]
#[test]
fn without_the_redis_feature_a_redis_url_is_refused() {
    use quotaengine::core::store::StoreSpec;
    let spec = StoreSpec::from_path("redis://127.0.0.1:1/0");
    assert!(matches!(spec, StoreSpec::Redis(_)));
    let err = spec.open(false, 100).err().unwrap();
    assert!(matches!(&err, StoreError::Incompatible(m) if m.contains("cargo feature `redis`")), "{err}");
    assert!(!std::path::Path::new("redis:").exists());
}
