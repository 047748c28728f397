//! What a waiter waits for (SPEC 24.5): the capacity that refused it, named by whose
//! usage it counts, never by the key the call asked for.
//!
//! A refusal names a gate; the gate's scope says which admissions draw on it: a route's
//! cooldown or a model's limit at scope `"key"` the route alone; a model's limit at
//! scope `"account"` every key of the account on that model; a provider cap or a
//! platform limit at scope `"account"` every model of every key of the account; the
//! concurrency cap or a platform limit at scope `"key"` every model of the key; a
//! tenant's limit every call made for the tenant. A candidate route *draws on* a
//! capacity when its admission would take from it: then a waiter on that candidate
//! comes after the waiters ahead of it for that capacity (17.2, 22.1), and only then.
use crate::core::error::{Reason, Refusal};
use crate::core::limits::Scope;
use crate::core::types::Route;
use std::sync::Arc;

/// One capacity, by the admissions that draw on it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Capacity {
    /// One route's: its cooldown, a model's limit at scope `"key"`.
    Route { platform: Arc<str>, model_id: Arc<str>, key_id: i64 },
    /// A model's limit at scope `"account"`: every key of the account on the model.
    Model { platform: Arc<str>, account: Arc<str>, model_id: Arc<str> },
    /// Every model of every key of an account: the provider caps (SPEC §8), a platform
    /// limit at scope `"account"` (SPEC 23.3).
    Account { platform: Arc<str>, account: Arc<str> },
    /// Every model of one key: its concurrency cap, a platform limit at scope `"key"`.
    Key { platform: Arc<str>, key_id: i64 },
    /// A tenant's limits (SPEC 23.2): every call made for it.
    Tenant(Arc<str>),
}

/// A candidate of a waiting call as the queue sees it: its route and the account its
/// key belongs to (SPEC §14.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spot {
    pub platform: Arc<str>,
    pub model_id: Arc<str>,
    pub key_id: i64,
    pub account: Arc<str>,
}

impl Spot {
    pub fn new(route: &Route, account: Arc<str>) -> Spot {
        Spot {
            platform: Arc::from(route.platform.as_str()),
            model_id: Arc::from(route.model_id.as_str()),
            key_id: route.key_id,
            account,
        }
    }

    /// Whether this spot is `route`.
    pub fn is(&self, platform: &str, model_id: &str, key_id: i64) -> bool {
        self.key_id == key_id && &*self.platform == platform && &*self.model_id == model_id
    }

    /// The capacity a refusal of this candidate names; `None` for a candidate the
    /// request excluded (SPEC 24.7: it never frees).
    pub fn refused_by(&self, r: &Refusal) -> Option<Capacity> {
        let platform = self.platform.clone();
        if let Some(t) = &r.tenant {
            return Some(Capacity::Tenant(Arc::from(t.as_str())));
        }
        let route = || Capacity::Route {
            platform: platform.clone(),
            model_id: self.model_id.clone(),
            key_id: self.key_id,
        };
        let key = || Capacity::Key { platform: platform.clone(), key_id: self.key_id };
        let account = || Capacity::Account { platform: platform.clone(), account: self.account.clone() };
        Some(match (&r.reason, r.scope) {
            (Reason::Excluded, _) => return None,
            (Reason::Cooldown, _) => route(),
            (Reason::KeyConcurrency, _) => key(),
            (Reason::Declared(_), Some(Scope::Account)) => Capacity::Model {
                platform: platform.clone(),
                account: self.account.clone(),
                model_id: self.model_id.clone(),
            },
            (Reason::Declared(_), Some(Scope::Provider | Scope::PlatformAccount)) => account(),
            (Reason::Declared(_), Some(Scope::PlatformKey)) => key(),
            // A model's limit at scope "key" (or a scope not named: the narrowest).
            (Reason::Declared(_), _) => route(),
        })
    }

    /// Whether admitting a call on this spot, made for `tenants`, takes from `c`.
    pub fn draws_on(&self, tenants: &[Arc<str>], c: &Capacity) -> bool {
        match c {
            Capacity::Route { platform, model_id, key_id } => {
                *key_id == self.key_id && *platform == self.platform && *model_id == self.model_id
            }
            Capacity::Model { platform, account, model_id } => {
                *platform == self.platform && *model_id == self.model_id && *account == self.account
            }
            Capacity::Account { platform, account } => *platform == self.platform && *account == self.account,
            Capacity::Key { platform, key_id } => *key_id == self.key_id && *platform == self.platform,
            Capacity::Tenant(name) => tenants.contains(name),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spot(model: &str, key: i64, account: &str) -> Spot {
        Spot::new(&Route { platform: "p".into(), model_id: model.into(), key_id: key }, Arc::from(account))
    }

    fn refusal(reason: Reason, scope: Option<Scope>, tenant: Option<&str>) -> Refusal {
        Refusal {
            reason,
            retry_at_ms: None,
            platform: "p".into(),
            model_id: "a".into(),
            key_id: 1,
            tenant: tenant.map(str::to_string),
            scope,
            candidates: Vec::new(),
        }
    }

    #[test]
    fn each_scope_is_drawn_on_by_the_admissions_it_counts() {
        let a1 = spot("a", 1, "acct");
        let (a2, b1, b3) = (spot("a", 2, "acct"), spot("b", 1, "acct"), spot("b", 3, "other"));
        let rpm = Reason::declared("rpm");
        let by =
            |reason: Reason, scope| a1.refused_by(&refusal(reason, scope, None)).unwrap_or_else(|| panic!());
        // (capacity, drawn on by a1's neighbours a2 (same model, other key), b1 (same key, other
        // model), b3 (another account))
        let cases = [
            (by(Reason::Cooldown, None), [false, false, false]),
            (by(rpm.clone(), Some(Scope::Key)), [false, false, false]),
            (by(rpm.clone(), Some(Scope::Account)), [true, false, false]),
            (by(rpm.clone(), Some(Scope::Provider)), [true, true, false]),
            (by(rpm.clone(), Some(Scope::PlatformAccount)), [true, true, false]),
            (by(rpm.clone(), Some(Scope::PlatformKey)), [false, true, false]),
            (by(Reason::KeyConcurrency, None), [false, true, false]),
        ];
        for (c, expect) in cases {
            assert!(a1.draws_on(&[], &c), "{c:?}");
            let got = [a2.draws_on(&[], &c), b1.draws_on(&[], &c), b3.draws_on(&[], &c)];
            assert_eq!(got, expect, "{c:?}");
        }
        let t = a1.refused_by(&refusal(rpm, Some(Scope::Tenant), Some("u"))).unwrap_or_else(|| panic!());
        assert_eq!(t, Capacity::Tenant(Arc::from("u")));
        assert!(b3.draws_on(&[Arc::from("v"), Arc::from("u")], &t));
        assert!(!a1.draws_on(&[Arc::from("v")], &t));
        assert_eq!(a1.refused_by(&refusal(Reason::Excluded, None, None)), None);
    }
}
