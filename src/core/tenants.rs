//! Tenants (SPEC 23.2): whoever a request is served for (a user, a team, an API key of
//! the router's own, a tag). A call names up to [`MAX_TENANTS`]; each has its own
//! windows and leases in the mirror, and its limits come from its own declaration or
//! the longest pattern (`"team:*"`, `"*"`) that matches its name.
use crate::core::calendar::Calendar;
use crate::core::error::{Error, Result};
use crate::core::limits::{Limit, LimitSet};
use std::collections::HashMap;
use std::sync::Arc;

/// The tenants one call names, in the order given, each once (empty: none). Cheap to
/// clone: usage rows and leases share it.
pub type TenantList = Arc<[Arc<str>]>;

/// At most this many distinct tenants a call.
pub const MAX_TENANTS: usize = 16;
/// A tenant's name is at most this many characters.
pub const MAX_NAME_CHARS: usize = 256;

/// No tenant (one shared empty list: the hot path allocates nothing for it).
pub fn none() -> TenantList {
    static NONE: std::sync::OnceLock<TenantList> = std::sync::OnceLock::new();
    NONE.get_or_init(|| Arc::from(Vec::<Arc<str>>::new())).clone()
}

/// Checks a tenant's name or a pattern (`pattern`: a name ending in `*` is allowed).
pub fn check_name(name: &str, pattern: bool) -> Result<()> {
    if name.is_empty() {
        return Err(Error::invalid("a tenant is a non-empty string"));
    }
    if name.contains('\0') {
        return Err(Error::invalid(format!("tenant {name:?} contains a NUL character")));
    }
    if name.chars().count() > MAX_NAME_CHARS {
        return Err(Error::invalid(format!("a tenant's name is at most {MAX_NAME_CHARS} characters")));
    }
    if !pattern && is_pattern(name) {
        return Err(Error::invalid(format!(
            "{name:?} is a pattern (it ends with '*'): name a tenant, not a pattern, in a call"
        )));
    }
    Ok(())
}

/// A name ending in `*` is a pattern: it declares limits for the tenants it matches
/// and is never a tenant itself.
pub fn is_pattern(name: &str) -> bool {
    name.ends_with('*')
}

/// The tenants of a call as given: each checked, duplicates dropped (the first kept),
/// at most [`MAX_TENANTS`].
pub fn parse(names: Vec<String>) -> Result<TenantList> {
    let mut out: Vec<Arc<str>> = Vec::with_capacity(names.len());
    for n in names {
        check_name(&n, false)?;
        if !out.iter().any(|o| **o == *n) {
            out.push(Arc::from(n));
        }
    }
    if out.is_empty() {
        return Ok(none());
    }
    if out.len() > MAX_TENANTS {
        return Err(Error::invalid(format!(
            "a call names at most {MAX_TENANTS} tenants, got {} distinct ones",
            out.len()
        )));
    }
    Ok(Arc::from(out))
}

/// One tenant's declaration (or a pattern's), as `set_tenant_limits` gives it.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantDecl {
    /// At tenant scope, reasons `tenant:<metric>/<per>`, in gate order.
    pub limits: LimitSet,
    /// The IANA zone its calendar periods start in (`None`: UTC).
    pub tz: Option<String>,
    /// Where its periods start.
    pub cal: Calendar,
}

impl TenantDecl {
    /// A declaration from limits as a user writes them (scope `"account"`) and a zone.
    pub fn new(limits: Vec<Limit>, tz: Option<String>) -> Result<TenantDecl> {
        let cal = match &tz {
            Some(z) => Calendar::of_zone(z)
                .ok_or_else(|| Error::invalid(format!("unknown time zone {z:?}: give an IANA name")))?,
            None => Calendar::default(),
        };
        Ok(TenantDecl { limits: LimitSet::tenant(limits)?, tz, cal })
    }

    /// As a store keeps it; a stored declaration that is no longer valid declares
    /// nothing.
    pub fn stored(limits: Vec<Limit>, tz: Option<String>) -> TenantDecl {
        TenantDecl::new(limits, tz.clone()).unwrap_or_else(|_| TenantDecl {
            limits: LimitSet::default(),
            tz,
            cal: Calendar::default(),
        })
    }
}

/// Every declaration, of tenants and of patterns, with the patterns longest first.
#[derive(Debug, Default, Clone)]
pub struct TenantTable {
    own: HashMap<String, TenantDecl>,
    /// (prefix before the `*`, declaration), longest prefix first.
    patterns: Vec<(String, TenantDecl)>,
    /// Bumped at every change: a tenant's windows are checked again after one.
    pub version: u64,
}

impl TenantTable {
    pub fn is_empty(&self) -> bool {
        self.own.is_empty() && self.patterns.is_empty()
    }

    /// Replaces the declaration of `name` (a tenant or a pattern); an empty set forgets it.
    pub fn put(&mut self, name: &str, decl: TenantDecl) {
        self.version += 1;
        let forget = decl.limits.is_empty();
        if let Some(prefix) = name.strip_suffix('*') {
            self.patterns.retain(|(p, _)| p != prefix);
            if !forget {
                self.patterns.push((prefix.to_string(), decl));
                self.patterns.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then_with(|| a.0.cmp(&b.0)));
            }
        } else if forget {
            self.own.remove(name);
        } else {
            self.own.insert(name.to_string(), decl);
        }
    }

    /// Every declaration as stored: (name as declared, the pattern's `*` kept; decl).
    pub fn replace(&mut self, rows: Vec<(String, TenantDecl)>) {
        self.version += 1;
        self.own.clear();
        self.patterns.clear();
        for (name, decl) in rows {
            self.put(&name, decl);
        }
    }

    /// The declaration in force for a tenant: its own, else the longest pattern that
    /// matches its name.
    pub fn of(&self, tenant: &str) -> Option<&TenantDecl> {
        if self.is_empty() {
            return None;
        }
        self.own
            .get(tenant)
            .or_else(|| self.patterns.iter().find(|(p, _)| tenant.starts_with(p.as_str())).map(|(_, d)| d))
    }

    /// What `tenant_limits(name)` reports: a pattern's own declaration, else the one in
    /// force for the tenant.
    pub fn declaration(&self, name: &str) -> Option<&TenantDecl> {
        match name.strip_suffix('*') {
            Some(prefix) => self.patterns.iter().find(|(p, _)| p == prefix).map(|(_, d)| d),
            None => self.of(name),
        }
    }

    /// The declarations as written (a pattern with its `*`), sorted by name.
    pub fn declared(&self) -> Vec<(String, &TenantDecl)> {
        let mut all: Vec<(String, &TenantDecl)> = self
            .own
            .iter()
            .map(|(n, d)| (n.clone(), d))
            .chain(self.patterns.iter().map(|(p, d)| (format!("{p}*"), d)))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// The tenants declared by name (never a pattern).
    pub fn named(&self) -> impl Iterator<Item = &str> {
        self.own.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decl(n: i64) -> TenantDecl {
        TenantDecl::new(vec![Limit::parse("requests", n, "minute", "account").expect("limit")], None)
            .expect("decl")
    }

    #[test]
    fn names_are_checked_and_deduplicated() {
        let t = parse(vec!["a".into(), "b".into(), "a".into()]).expect("parse");
        assert_eq!(t.iter().map(|s| &**s).collect::<Vec<_>>(), ["a", "b"]);
        assert!(parse(vec![String::new()]).is_err());
        assert!(parse(vec!["x\0y".into()]).is_err());
        assert!(parse(vec!["team:*".into()]).is_err());
        assert!(parse(vec!["é".repeat(257)]).is_err());
        assert!(parse(vec!["é".repeat(256)]).is_ok());
        assert!(parse((0..17).map(|i| i.to_string()).collect()).is_err());
        assert!(parse((0..16).map(|i| i.to_string()).chain(["0".to_string()]).collect()).is_ok());
    }

    #[test]
    fn the_own_declaration_then_the_longest_pattern_wins() {
        let mut t = TenantTable::default();
        t.put("*", decl(1));
        t.put("team:*", decl(2));
        t.put("team:red", decl(3));
        let limit = |t: &TenantTable, name: &str| {
            t.of(name).map(|d| d.limits.iter().next().expect("one").limit.limit)
        };
        assert_eq!(limit(&t, "team:red"), Some(3));
        assert_eq!(limit(&t, "team:blue"), Some(2));
        assert_eq!(limit(&t, "user:1"), Some(1));
        t.put("*", TenantDecl::new(vec![], None).expect("empty"));
        assert_eq!(limit(&t, "user:1"), None);
        assert_eq!(t.declared().iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["team:*", "team:red"]);
        // the store's whole table read again, even empty, is a change the tenants see
        let v = t.version;
        t.replace(Vec::new());
        assert!(t.version > v && t.of("team:red").is_none());
    }
}
