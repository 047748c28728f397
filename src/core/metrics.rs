//! SPEC 27.2: what a Prometheus scrape of an engine reads ([`Scrape::read`], one call
//! of the engine), the families it yields ([`FAMILIES`]: the one table of names, help,
//! types and labels, which the Python collector builds its families from too), the
//! samples of each gauge family ([`Scrape::routes`], [`Scrape::cooldowns`]) and their
//! text exposition ([`Scrape::exposition`], written by the `prometheus-client` crate).
use crate::core::engine::{SnapshotRow, TenantWindow, UsageReport, DEFAULT_LOOKBACK_MS};
use crate::core::error::{Error, Result};
use crate::core::handle::Handle;
use crate::core::stats::Stats;
use crate::core::types::Cooldown;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use std::fmt;

/// The `Content-Type` of [`Scrape::exposition`]: Prometheus' text format 0.0.4.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// A family's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Gauge,
    Counter,
    Histogram,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
            Kind::Histogram => "histogram",
        }
    }

    fn metric_type(self) -> MetricType {
        match self {
            Kind::Gauge => MetricType::Gauge,
            Kind::Counter => MetricType::Counter,
            Kind::Histogram => MetricType::Histogram,
        }
    }
}

/// One family of SPEC 27.2's table: `key` names it in the read (`used`, `limit`, ...);
/// `name` is a counter's without `_total` (the exposition adds it).
#[derive(Debug, Clone, Copy)]
pub struct Family {
    pub key: &'static str,
    pub name: &'static str,
    pub help: &'static str,
    pub kind: Kind,
    pub labels: &'static [&'static str],
}

const ROUTE: &[&str] = &["platform", "model", "key"];
const WINDOW: &[&str] = &["platform", "model", "key", "window"];
const TENANT: &[&str] = &["tenant", "window"];

/// SPEC 27.2's families, in the order a scrape yields them.
pub const FAMILIES: [Family; 12] = [
    Family {
        key: "used",
        name: "quotaengine_window_used",
        help: "What a route's window has used (requests, tokens, or micro-dollars for cost).",
        kind: Kind::Gauge,
        labels: WINDOW,
    },
    Family {
        key: "limit",
        name: "quotaengine_window_limit",
        help: "The limit of a route's window (absent when it has none).",
        kind: Kind::Gauge,
        labels: WINDOW,
    },
    Family {
        key: "in_flight",
        name: "quotaengine_in_flight",
        help: "A route's live leases.",
        kind: Kind::Gauge,
        labels: ROUTE,
    },
    Family {
        key: "cooldown",
        name: "quotaengine_cooldown_remaining_seconds",
        help: "Seconds left of a route's cooldown (key '*': a model-wide bench).",
        kind: Kind::Gauge,
        labels: &["platform", "model", "key", "source"],
    },
    Family {
        key: "exhausts",
        name: "quotaengine_exhausts_in_seconds",
        help: "Seconds until the route's earliest window would run out at the recent pace.",
        kind: Kind::Gauge,
        labels: ROUTE,
    },
    Family {
        key: "tenant_used",
        name: "quotaengine_tenant_used",
        help: "What a tenant has used of a limit's window (micro-dollars for cost).",
        kind: Kind::Gauge,
        labels: TENANT,
    },
    Family {
        key: "tenant_limit",
        name: "quotaengine_tenant_limit",
        help: "A tenant's limit (micro-dollars for cost).",
        kind: Kind::Gauge,
        labels: TENANT,
    },
    Family {
        key: "admitted",
        name: "quotaengine_admitted",
        help: "Leases this process's engine took.",
        kind: Kind::Counter,
        labels: &["platform", "model"],
    },
    Family {
        key: "refused",
        name: "quotaengine_refused",
        help: "QuotaExceeded raised to a caller, by reason.",
        kind: Kind::Counter,
        labels: &["reason"],
    },
    Family {
        key: "failures",
        name: "quotaengine_failures",
        help: "Failures recorded, by platform and kind.",
        kind: Kind::Counter,
        labels: &["platform", "kind"],
    },
    Family {
        key: "waits",
        name: "quotaengine_wait_seconds",
        help: "How long the calls that waited for capacity waited.",
        kind: Kind::Histogram,
        labels: &[],
    },
    Family {
        key: "degraded",
        name: "quotaengine_degraded",
        help: "1 while the engine serves from memory because the database fails.",
        kind: Kind::Gauge,
        labels: &[],
    },
];

/// Everything one scrape reports, read from the engine in one call.
#[derive(Debug)]
pub struct Scrape {
    pub now_ms: i64,
    /// Every route with usage today, a live lease or a cooldown (`snapshot()`'s rows).
    pub routes: Vec<SnapshotRow>,
    /// Each route's `usage()` report, in `routes`' order: its windows are the `used` and
    /// `limit` samples (each declared limit's use at its scope, the platform's included).
    pub usage: Vec<UsageReport>,
    pub cooldowns: Vec<Cooldown>,
    /// Every tenant limit in force.
    pub tenants: Vec<TenantWindow>,
    pub stats: Stats,
    pub degraded: bool,
}

/// One route's gauges: its labels, its windows `(window, used, limit)` as `usage()`
/// reports them (SPEC 27.2: the `usage()` key, its `used` at the limit's scope, a shared
/// account's or the platform's), its live leases, and the seconds to its earliest
/// forecast (if any).
#[derive(Debug)]
pub struct RouteGauges<'a> {
    pub platform: &'a str,
    pub model: &'a str,
    pub key: String,
    pub windows: Vec<(&'a str, i64, Option<i64>)>,
    pub in_flight: i64,
    pub exhausts_in_s: Option<f64>,
}

/// One active cooldown's gauge: its labels (`key` `*` for a model-wide bench) and the
/// seconds it has left.
#[derive(Debug)]
pub struct CooldownGauge<'a> {
    pub platform: &'a str,
    pub model: &'a str,
    pub key: String,
    pub source: &'static str,
    pub remaining_s: f64,
}

impl Scrape {
    /// One read of the engine (its lock taken once).
    pub fn read(h: &Handle) -> Result<Scrape> {
        let mut scrape = h.with(|e| {
            let routes = e.observed().snapshot()?;
            let keys: Vec<_> = routes.iter().map(|r| r.route.clone()).collect();
            Ok(Scrape {
                usage: e.usage().reports(&keys)?,
                routes,
                cooldowns: e.failures().active_cooldowns(None)?,
                tenants: e.tenant_snapshot(DEFAULT_LOOKBACK_MS)?.1,
                now_ms: e.now_ms(),
                stats: e.stats(),
                degraded: e.degraded(),
            })
        })?;
        scrape.stats = h.complete_stats(std::mem::take(&mut scrape.stats));
        Ok(scrape)
    }

    /// Seconds from now to `at_ms`, never negative.
    fn seconds_to(&self, at_ms: i64) -> f64 {
        at_ms.saturating_sub(self.now_ms).max(0) as f64 / 1000.0
    }

    /// Each route's gauges (SPEC 27.2: a window with no limit has a `used` sample and
    /// no `limit` sample; no `exhausts` sample without a forecast).
    pub fn routes(&self) -> impl Iterator<Item = RouteGauges<'_>> {
        self.routes.iter().zip(&self.usage).map(|(r, u)| RouteGauges {
            platform: &r.route.platform,
            model: &r.route.model_id,
            key: r.route.key_id.to_string(),
            windows: u.windows().map(|(name, w)| (name, w.used, w.limit)).collect(),
            in_flight: r.in_flight,
            exhausts_in_s: r.exhausts_at_ms.map(|at| self.seconds_to(at)),
        })
    }

    /// Each active cooldown's gauge.
    pub fn cooldowns(&self) -> impl Iterator<Item = CooldownGauge<'_>> {
        self.cooldowns.iter().map(|c| CooldownGauge {
            platform: &c.route.platform,
            model: &c.route.model_id,
            key: if c.model_wide { "*".to_string() } else { c.route.key_id.to_string() },
            source: c.source.as_str(),
            remaining_s: self.seconds_to(c.expires_at_ms),
        })
    }

    /// The families in Prometheus' text format 0.0.4 ([`CONTENT_TYPE`]), written by the
    /// `prometheus-client` crate (label values and help escaped as the format says).
    pub fn exposition(self) -> Result<String> {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::new();
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
            .map_err(|e| Error::Internal(format!("writing the metrics' text: {e}")))?;
        Ok(out)
    }
}

/// `quotaengine_wait_seconds`: the waits' bounds and counts per bucket (not cumulative,
/// as the crate takes them), their count and their seconds.
struct Waits<'a>(&'a Stats);

impl fmt::Debug for Waits<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Waits").field("count", &self.0.waits).finish()
    }
}

impl EncodeMetric for Waits<'_> {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        let mut below = 0;
        let buckets: Vec<(f64, u64)> = (self.0.wait_buckets.iter())
            .map(|&(bound, cumulative)| {
                let n = cumulative.saturating_sub(below);
                below = cumulative;
                (bound, n)
            })
            .collect();
        encoder.encode_histogram::<NoLabelSet>(self.0.wait_s, self.0.waits, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// The family of [`FAMILIES`] keyed `key` (a key of the table: the encoder names them).
fn table(key: &str) -> &'static Family {
    FAMILIES.iter().find(|f| f.key == key).expect("a family of the table")
}

/// Writes one family: its descriptor, then `value` under `labels` for each sample.
fn family<L, V>(
    encoder: &mut DescriptorEncoder, key: &str, samples: impl IntoIterator<Item = (L, V)>,
) -> fmt::Result
where
    L: EncodeLabelSet,
    V: EncodeMetric,
{
    let f = table(key);
    let mut metric = encoder.encode_descriptor(f.name, f.help, None, f.kind.metric_type())?;
    for (labels, value) in samples {
        value.encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

/// A family of one unlabelled sample.
fn single(encoder: &mut DescriptorEncoder, key: &str, value: &impl EncodeMetric) -> fmt::Result {
    let f = table(key);
    value.encode(encoder.encode_descriptor(f.name, f.help, None, f.kind.metric_type())?)
}

fn route<'a>(r: &'a RouteGauges<'_>) -> [(&'static str, &'a str); 3] {
    [("platform", r.platform), ("model", r.model), ("key", &r.key)]
}

fn window<'a>(r: &'a RouteGauges<'_>, w: &'a str) -> [(&'static str, &'a str); 4] {
    [("platform", r.platform), ("model", r.model), ("key", &r.key), ("window", w)]
}

fn tenant(t: &TenantWindow) -> [(&'static str, &str); 2] {
    [("tenant", &t.tenant), ("window", &t.window)]
}

impl Collector for Scrape {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let routes: Vec<RouteGauges<'_>> = self.routes().collect();
        let gauge = |v: f64| ConstGauge::new(v);
        let windows = || routes.iter().flat_map(|r| r.windows.iter().map(move |w| (r, w)));
        family(&mut encoder, "used", windows().map(|(r, &(w, used, _))| (window(r, w), gauge(used as f64))))?;
        family(
            &mut encoder,
            "limit",
            windows().filter_map(|(r, &(w, _, limit))| limit.map(|l| (window(r, w), gauge(l as f64)))),
        )?;
        let cooldowns: Vec<CooldownGauge<'_>> = self.cooldowns().collect();
        family(&mut encoder, "in_flight", routes.iter().map(|r| (route(r), gauge(r.in_flight as f64))))?;
        family(
            &mut encoder,
            "cooldown",
            cooldowns.iter().map(|c| {
                let labels =
                    [("platform", c.platform), ("model", c.model), ("key", &c.key), ("source", c.source)];
                (labels, gauge(c.remaining_s))
            }),
        )?;
        family(
            &mut encoder,
            "exhausts",
            routes.iter().filter_map(|r| r.exhausts_in_s.map(|s| (route(r), gauge(s)))),
        )?;
        family(&mut encoder, "tenant_used", self.tenants.iter().map(|t| (tenant(t), gauge(t.used as f64))))?;
        family(
            &mut encoder,
            "tenant_limit",
            self.tenants.iter().map(|t| (tenant(t), gauge(t.limit as f64))),
        )?;
        let s = &self.stats;
        let count = |n: &u64| ConstCounter::new(*n);
        family(
            &mut encoder,
            "admitted",
            s.admitted
                .iter()
                .map(|((p, m), n)| ([("platform", p.as_str()), ("model", m.as_str())], count(n))),
        )?;
        family(&mut encoder, "refused", s.refused.iter().map(|(r, n)| ([("reason", r.as_str())], count(n))))?;
        family(
            &mut encoder,
            "failures",
            s.failures.iter().map(|((p, k), n)| ([("platform", p.as_str()), ("kind", k.as_str())], count(n))),
        )?;
        single(&mut encoder, "waits", &Waits(s))?;
        single(&mut encoder, "degraded", &ConstGauge::new(i64::from(self.degraded)))
    }
}
