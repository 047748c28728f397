//! The mirrored live leases (SPEC 4's "in flight", SPEC 5's lease age).
use crate::core::admission::{Estimate, InFlight};
use crate::core::state::{FastMap, RouteId};
use crate::core::store::LeaseRow;
use crate::core::tenants::TenantList;

#[derive(Debug, Clone)]
pub struct LeaseRec {
    pub route: RouteId,
    pub tokens: i64,
    /// Of `tokens`, the estimated output.
    pub output_tokens: i64,
    /// The µ$ it reserves (SPEC 23.1).
    pub cost: i64,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    /// The tenants it is taken for (SPEC 23.2).
    pub tenants: TenantList,
    /// How many other leases were live on its key when this engine admitted it (SPEC
    /// 24.2: what a concurrency failure of it learns); `None` for a lease read from
    /// the store only.
    pub others_at_admission: Option<i64>,
}

impl LeaseRec {
    /// What it holds in flight: its estimate and its reservation.
    pub fn estimate(&self) -> Estimate {
        Estimate { tokens: self.tokens, output: self.output_tokens, cost: self.cost }
    }

    /// The record of a lease as written or stored, on its route (the one constructor).
    pub fn of(route: RouteId, row: &LeaseRow) -> LeaseRec {
        LeaseRec {
            route,
            tokens: row.tokens,
            output_tokens: row.output_tokens,
            cost: row.cost,
            created_at_ms: row.created_at_ms,
            expires_at_ms: row.expires_at_ms,
            tenants: row.tenants.clone(),
            others_at_admission: None,
        }
    }

    /// A lease counts until it is older than `lease_max_age_ms` (SPEC §5): at exactly
    /// that age (`now == expires_at_ms`) it still counts.
    pub(super) fn live(&self, now: i64) -> bool {
        now <= self.expires_at_ms
    }
}

/// Every lease the mirror holds, by id (live, or expired and not yet pruned).
#[derive(Debug, Default)]
pub struct Leases {
    pub(super) by_id: FastMap<i64, LeaseRec>,
}

impl Leases {
    /// A lease the mirror holds (live or not yet pruned).
    pub fn get(&self, id: i64) -> Option<&LeaseRec> {
        self.by_id.get(&id)
    }

    /// Whether lease `id` is held and still counts at `now`.
    pub fn is_live(&self, id: i64, now: i64) -> bool {
        self.by_id.get(&id).is_some_and(|l| l.live(now))
    }

    /// What the live leases among `ids` hold in flight at `now`.
    pub fn in_flight(&self, ids: &[i64], now: i64) -> InFlight {
        let mut f = InFlight::default();
        for id in ids {
            if let Some(l) = self.by_id.get(id).filter(|l| l.live(now)) {
                f.add(l.estimate());
            }
        }
        f
    }
}
