//! Provider accounts (SPEC §8, §14.3): the keys one provider bills together, each with
//! its requests over every model, and, of an account of several keys, one group per
//! model counting what a limit at account scope counts. Routes name their account and
//! group by id; the mirror keeps the two tables in step.
use super::{AccountId, Config, FastMap, GroupId, Leases, RouteId, RouteState};
use crate::core::admission::InFlight;
use crate::core::calendar::Calendar;
use crate::core::limits::{LimitSet, WindowSpec};
use crate::core::types::KeyInfo;
use crate::core::windows::Windows;
use std::collections::HashMap;
use std::sync::Arc;

#[derive(Debug)]
pub(super) struct AccountState {
    pub(super) name: Arc<str>,
    /// Requests and raw tokens of every model of the account (SPEC §8's token cap
    /// bills tokens per route instead; SPEC 23.3's platform limits count them raw).
    pub(super) win: Windows,
    pub(super) routes: Vec<RouteId>,
    pub(super) leases: Vec<i64>,
}

/// Usage and live leases of every key of one account on one model: what a limit at
/// account scope counts (SPEC §14.1, §14.3).
#[derive(Debug)]
pub(super) struct GroupState {
    pub(super) win: Windows,
    pub(super) leases: Vec<i64>,
    pub(super) kept: LimitSet,
}

/// Usage and live leases of one key of an account of several keys over every model:
/// what a platform limit at scope `"key"` counts (SPEC 23.3). A key of its own account
/// has none: its account's counters serve.
#[derive(Debug)]
pub(super) struct TotalState {
    pub(super) account: AccountId,
    pub(super) win: Windows,
    pub(super) leases: Vec<i64>,
}

/// The index of a key's [`TotalState`].
pub type TotalId = u32;

#[derive(Debug, Default)]
pub(super) struct Accounts {
    pub(super) list: Vec<AccountState>,
    /// platform -> account name -> account.
    pub(super) index: FastMap<Arc<str>, FastMap<Arc<str>, AccountId>>,
    pub(super) groups: Vec<GroupState>,
    pub(super) group_index: FastMap<(AccountId, Arc<str>), GroupId>,
    /// (platform, account name) -> how many registered keys it has.
    members: HashMap<(String, Arc<str>), usize>,
    /// Per key of a shared account, its usage over every model (SPEC 23.3).
    pub(super) totals: Vec<TotalState>,
    pub(super) total_index: FastMap<(AccountId, i64), TotalId>,
}

impl Accounts {
    /// Whether an account has more than one registered key.
    pub(super) fn shared(&self, platform: &str, name: &Arc<str>) -> bool {
        self.members.get(&(platform.to_string(), name.clone())).is_some_and(|n| *n > 1)
    }

    /// Counts the registered keys of every named account.
    pub(super) fn count_members<'k>(&mut self, keys: impl Iterator<Item = &'k KeyInfo>) {
        let mut members: HashMap<(String, Arc<str>), usize> = HashMap::new();
        for k in keys {
            if let Some(a) = &k.account {
                *members.entry((k.platform.clone(), Arc::from(a.as_str()))).or_default() += 1;
            }
        }
        self.members = members;
    }

    /// The account of that name on a platform, when seen.
    pub(super) fn of(&self, platform: &str, name: &str) -> Option<AccountId> {
        self.index.get(platform)?.get(name).copied()
    }

    /// A new account, counting in `cal`'s days.
    pub(super) fn add(&mut self, platform: Arc<str>, name: Arc<str>, cal: Calendar) -> AccountId {
        let a = self.list.len() as AccountId;
        self.list.push(AccountState {
            name: name.clone(),
            win: Windows::new(cal),
            routes: vec![],
            leases: vec![],
        });
        self.index.entry(platform).or_default().insert(name, a);
        a
    }

    /// The (account, model) counters, created on first sight keeping `set`'s windows.
    pub(super) fn group(
        &mut self, a: AccountId, model_id: &Arc<str>, cal: Calendar, set: &LimitSet,
    ) -> GroupId {
        if let Some(g) = self.group_index.get(&(a, model_id.clone())) {
            return *g;
        }
        let g = self.groups.len() as GroupId;
        let mut win = Windows::new(cal);
        for spec in set.windows() {
            win.keep(spec);
        }
        self.groups.push(GroupState { win, leases: vec![], kept: LimitSet::default() });
        self.group_index.insert((a, model_id.clone()), g);
        g
    }

    /// The counters of `key_id` of account `a` over every model, created on first sight
    /// keeping the account's windows.
    pub(super) fn total(&mut self, a: AccountId, key_id: i64) -> TotalId {
        if let Some(t) = self.total_index.get(&(a, key_id)) {
            return *t;
        }
        let t = self.totals.len() as TotalId;
        let win = self.list[a as usize].win.cleared(self.list[a as usize].win.calendar().clone());
        self.totals.push(TotalState { account: a, win, leases: vec![] });
        self.total_index.insert((a, key_id), t);
        t
    }

    /// Forgets every account and group (the routes are assigned again).
    pub(super) fn clear(&mut self) {
        self.list.clear();
        self.index.clear();
        self.groups.clear();
        self.group_index.clear();
        self.totals.clear();
        self.total_index.clear();
    }

    /// A live lease of a route of account `a` (and of its group and its key's total).
    pub(super) fn add_lease(
        &mut self, a: AccountId, group: Option<GroupId>, total: Option<TotalId>, id: i64,
    ) {
        self.list[a as usize].leases.push(id);
        if let Some(g) = group {
            self.groups[g as usize].leases.push(id);
        }
        if let Some(t) = total {
            self.totals[t as usize].leases.push(id);
        }
    }

    /// Drops an account's events that left its windows and its leases that ended.
    pub(super) fn prune(&mut self, a: AccountId, leases: &Leases, now: i64) {
        let acct = &mut self.list[a as usize];
        acct.win.prune(now);
        acct.leases.retain(|id| leases.is_live(*id, now));
    }

    /// Live leases on an account, with tokens billed per lease at its own model's rate
    /// for a daily token cap of `cap`, and how many of them are `key_id`'s (the key
    /// concurrency cap is the key's, SPEC §4).
    pub(super) fn in_flight(
        &self, a: AccountId, key_id: i64, cap: Option<i64>,
        (routes, leases, config): (&[RouteState], &Leases, &Config), now: i64,
    ) -> (InFlight, i64) {
        let mut f = InFlight::default();
        let mut of_key = 0;
        for id in &self.list[a as usize].leases {
            if let Some(l) = leases.by_id.get(id).filter(|l| l.live(now)) {
                f.count += 1;
                f.est.cost = f.est.cost.saturating_add(l.cost);
                let r = &routes[l.route as usize];
                if r.key_id == key_id {
                    of_key += 1;
                }
                if let Some(cap) = cap {
                    f.est.tokens = f.est.tokens.saturating_add(r.billing(config, cap).bill(l.tokens));
                }
            }
        }
        (f, of_key)
    }

    /// Tokens of every model of an account in a window, billed at each model's
    /// multiplier for a token cap of `cap` (raw without one).
    pub(super) fn tokens(
        &self, a: AccountId, window: WindowSpec, cap: Option<i64>,
        (routes, config): (&[RouteState], &Config), now: i64,
    ) -> i64 {
        let mut total = 0i64;
        for rid in &self.list[a as usize].routes {
            let r = &routes[*rid as usize];
            let raw = r.win.counts(window, now).map_or(0, |c| c.tokens);
            let billed = match cap {
                Some(cap) => r.billing(config, cap).bill(raw),
                None => raw,
            };
            total = total.saturating_add(billed);
        }
        total
    }
}
