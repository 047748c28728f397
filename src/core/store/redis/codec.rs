//! How each kind of row is stored on Redis: one codec per kind of [`Write`], its
//! encoder (the script's arguments) beside its decoder (what a read brings back).
//!
//! Values are fields joined by `SEP` (`\x1f`); names in them are escaped ([`esc`]), an
//! optional text is `-` or `+text` ([`opt`]), an optional number is empty or the number.
//! A usage entry's or a lease's tenants (SPEC 23.2) end one of its fields, each after
//! `RS` (`\x1e`) and escaped so that it holds neither separator ([`esc_tenant`]).
//! A write is an opcode and its fields (see `redis.lua`): `U` a usage entry, `L`/`D` a
//! lease inserted/deleted, `HSET`/`HDEL` a small table's row, `CK`/`CE` cooldowns of a
//! key/expired, `H`/`HD` history inserted/deleted, `S` the sweep, `G` a `server_logs` row.
use super::{unavailable, SEP, SWEEP_BUDGET};
use crate::core::limits::{decode_caps, decode_limits, encode_caps, encode_limits, LimitSet};
use crate::core::money::Prices;
use crate::core::store::{
    Changes, CooldownRow, HistoryKind, HistoryRow, LeaseRow, LogRow, QuotaStateRow, StoreResult,
    TenantLimitsRow, TokenKinds, UsageKind, UsageRow, Write,
};
use crate::core::tenants::TenantList;
use crate::core::types::{CapOverrides, CapSetting, CooldownSource, KeyInfo, ModelInfo};
use redis::Value;
use std::sync::Arc;

// ---- the shapes of replies ----------------------------------------------------

fn bytes(v: &Value) -> Option<&[u8]> {
    match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

pub(super) fn text(v: &Value) -> StoreResult<String> {
    match v {
        Value::Int(i) => Ok(i.to_string()),
        Value::Okay => Ok("OK".into()),
        _ => bytes(v)
            .map(|b| String::from_utf8_lossy(b).into_owned())
            .ok_or_else(|| unavailable(format!("unexpected reply {v:?}"))),
    }
}

pub(super) fn array(v: &Value) -> StoreResult<&[Value]> {
    match v {
        Value::Array(a) => Ok(a),
        Value::Nil => Ok(&[]),
        _ => Err(unavailable(format!("unexpected reply {v:?}"))),
    }
}

pub(super) fn int(v: &Value) -> StoreResult<i64> {
    match v {
        Value::Int(i) => Ok(*i),
        _ => parse_i64(&text(v)?),
    }
}

/// Field/value pairs of an `HGETALL` reply.
pub(super) fn pairs(v: &Value) -> StoreResult<Vec<(String, String)>> {
    let a = array(v)?;
    a.chunks(2)
        .map(|c| match c {
            [f, v] => Ok((text(f)?, text(v)?)),
            _ => Err(unavailable("odd HGETALL reply")),
        })
        .collect()
}

/// Takes in the rows of small table `i` (in the order of `TABLES`) as a read brought
/// them (`HGETALL` pairs).
pub(super) fn take_table(i: usize, rows: Vec<(String, String)>, ch: &mut Changes) -> StoreResult<()> {
    match i {
        0 => ch.cooldowns = Some(rows.iter().map(|(f, v)| parse_cooldown(f, v)).collect::<StoreResult<_>>()?),
        1 => ch.keys = Some(rows.iter().map(|(_, v)| parse_key(v)).collect::<StoreResult<_>>()?),
        2 => ch.models = Some(rows.iter().map(|(f, v)| parse_model(f, v)).collect::<StoreResult<_>>()?),
        3 => ch.caps = Some(rows.iter().map(|(f, v)| parse_caps(f, v)).collect::<StoreResult<_>>()?),
        4 => {
            let mut hist = Vec::new();
            for (_, v) in &rows {
                hist.extend(parse_history(v)?);
            }
            ch.history = Some(hist);
        }
        5 => ch.calendars = Some(rows.into_iter().map(|(f, v)| (unesc(&f), v)).collect()),
        // SPEC 22.1: priority -> reserve fraction.
        6 => {
            ch.priorities = Some(
                rows.iter().map(|(f, v)| Ok((parse_i64(f)?, parse_f64(v)?))).collect::<StoreResult<_>>()?,
            )
        }
        // SPEC 23.1: route -> prices.
        7 => ch.prices = Some(rows.iter().map(|(f, v)| parse_prices(f, v)).collect::<StoreResult<_>>()?),
        // SPEC 23.3: platform -> its limits in the form of `encode_limits` (a value a
        // plain writer spoiled declares none).
        8 => {
            ch.platform_limits =
                Some(rows.iter().map(|(f, v)| (unesc(f), decode_limits(v).unwrap_or_default())).collect())
        }
        // SPEC 23.2: tenant or pattern -> its zone and its limits.
        9 => ch.tenant_limits = Some(rows.iter().map(|(f, v)| parse_tenant_limits(f, v)).collect()),
        // SPEC 8.2: the observed quota, in the order the SQLite store reads it.
        _ => {
            let mut quota = rows.iter().map(|(f, v)| parse_quota(f, v)).collect::<StoreResult<Vec<_>>>()?;
            quota.sort_by(|a, b| {
                (&a.platform, a.key_id, &a.pool_key, &a.metric).cmp(&(
                    &b.platform,
                    b.key_id,
                    &b.pool_key,
                    &b.metric,
                ))
            });
            ch.quota_states = Some(quota);
        }
    }
    Ok(())
}

/// Appends the script arguments of one write to `out`.
pub(super) fn encode(w: &Write, out: &mut Vec<String>) {
    match w {
        Write::Usage(u) => out.extend(["U".into(), u.created_at_ms.to_string(), usage_entry(u)]),
        Write::InsertLease(l) => {
            out.extend(["L".into(), l.id.to_string(), l.created_at_ms.to_string(), lease_value(l)])
        }
        Write::DeleteLease(id) => out.extend(["D".into(), id.to_string()]),
        // SPEC 24.1: each renewed lease written whole again (an upsert).
        Write::RenewLeases(rows) => {
            for l in rows {
                out.extend(["L".into(), l.id.to_string(), l.created_at_ms.to_string(), lease_value(l)]);
            }
        }
        Write::UpsertCooldown(c) => {
            hset(out, "cooldowns", cooldown_field(c.key_id, &c.platform, &c.model_id), cooldown_value(c))
        }
        Write::DeleteCooldown { platform, model_id, key_id } => {
            hdel(out, "cooldowns", cooldown_field(Some(*key_id), platform, model_id))
        }
        Write::DeleteCooldownsForKey(k) => out.extend(["CK".into(), k.to_string()]),
        Write::DeleteExpiredCooldowns(now) => out.extend(["CE".into(), now.to_string()]),
        Write::UpsertKey(k) => hset(out, "keys", k.key_id.to_string(), key_value(k)),
        Write::UpsertModel(m) => hset(out, "models", route(&m.platform, &m.model_id), model_value(m)),
        Write::SetCaps(platform, c) => hset(out, "caps", esc(platform), caps_value(c)),
        Write::ResetCaps(platform) => hdel(out, "caps", esc(platform)),
        Write::UpsertQuotaState(q) => hset(out, "quota", quota_field(q), quota_value(q)),
        Write::InsertHistory(h) => out.extend(["H".into(), history_value(h)]),
        Write::DeleteHistory { key_id, route: r, kinds } => {
            let kinds: Vec<&str> = kinds.iter().map(|k| k.as_str()).collect();
            out.extend([
                "HD".into(),
                key_id.to_string(),
                r.as_ref().map_or_else(String::new, |(p, m)| route(p, m)),
                format!(",{},", kinds.join(",")),
            ]);
        }
        Write::Sweep { usage_before, kept, leases_expired_before, history_before } => {
            out.extend([
                "S".into(),
                usage_before.max(&0).to_string(),
                leases_expired_before.to_string(),
                history_before.to_string(),
                kept.len().to_string(),
            ]);
            for k in kept.iter() {
                // A kept tenant (SPEC 24.3) as the script names one: `RS` and its name.
                let name = k.tenant.as_deref().map_or_else(|| route(&k.platform, &k.model_id), tenant_watch);
                out.extend([name, k.before.max(0).to_string()]);
            }
            out.push(SWEEP_BUDGET.to_string());
        }
        Write::SetCalendar { platform, zone: Some(z) } => hset(out, "calendars", esc(platform), z.clone()),
        Write::SetCalendar { platform, zone: None } => hdel(out, "calendars", esc(platform)),
        Write::Log(l) => out.extend(["G".into(), log_value(l)]),
        Write::SetPriorityReserve { priority, fraction } => {
            hset(out, "priorities", priority.to_string(), fraction.to_string())
        }
        Write::SetModelPrices { platform, model_id, prices: Some(p) } => {
            hset(out, "prices", route(platform, model_id), prices_value(p))
        }
        Write::SetModelPrices { platform, model_id, prices: None } => {
            hdel(out, "prices", route(platform, model_id))
        }
        Write::SetPlatformLimits { platform, limits } if limits.is_empty() => {
            hdel(out, "platform_limits", esc(platform))
        }
        Write::SetPlatformLimits { platform, limits } => {
            hset(out, "platform_limits", esc(platform), encode_limits(limits))
        }
        Write::SetTenantLimits(t) if t.limits.is_empty() => hdel(out, "tenant_limits", esc(&t.tenant)),
        Write::SetTenantLimits(t) => hset(out, "tenant_limits", esc(&t.tenant), tenant_limits_value(t)),
    }
}

fn hset(out: &mut Vec<String>, table: &str, field: String, value: String) {
    out.extend(["HSET".into(), table.into(), field, value]);
}

fn hdel(out: &mut Vec<String>, table: &str, field: String) {
    out.extend(["HDEL".into(), table.into(), field]);
}

/// An account as the script's conflict check names it: `key SEP platform`.
pub(super) fn account(key_id: i64, platform: &str) -> String {
    format!("{key_id}{SEP}{}", esc(platform))
}

/// A tenant as the script's conflict check names it (SPEC 23.2): `RS` and its escaped
/// name, never an account (those start with a key's number).
pub(super) fn tenant_watch(tenant: &str) -> String {
    format!("{RS}{}", esc_tenant(tenant))
}

// ---- the parts of a value ---------------------------------------------------------

/// Escapes the separator (and the escape) out of a name.
pub(super) fn esc(s: &str) -> String {
    if !s.contains(['\\', SEP]) {
        return s.to_string();
    }
    s.replace('\\', "\\\\").replace(SEP, "\\u")
}

/// The separator of a field's tenants (SPEC 23.2).
pub(super) const RS: char = '\u{1e}';

/// Escapes a tenant's name as [`esc`] does, and `RS` too (`\r`): it holds neither
/// separator.
pub(super) fn esc_tenant(s: &str) -> String {
    if !s.contains(['\\', SEP, RS]) {
        return s.to_string();
    }
    s.replace('\\', "\\\\").replace(SEP, "\\u").replace(RS, "\\r")
}

/// `RS` and each tenant, escaped: what ends a field that carries them (empty for none).
fn tenants_suffix(tenants: &[Arc<str>]) -> String {
    tenants.iter().map(|t| format!("{RS}{}", esc_tenant(t))).collect()
}

/// A field that may end with tenants: what comes before them, and the tenants.
fn split_tenants(field: &str) -> (&str, TenantList) {
    match field.split_once(RS) {
        None => (field, crate::core::tenants::none()),
        Some((head, rest)) => (head, rest.split(RS).map(|t| Arc::from(unesc(t))).collect()),
    }
}

/// Reverses [`esc`] and [`esc_tenant`].
pub(super) fn unesc(s: &str) -> String {
    if !s.contains('\\') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\\' {
            match it.next() {
                Some('u') => out.push(SEP),
                Some('r') => out.push(RS),
                Some(c) => out.push(c),
                None => {}
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The route fields that end a value: `platform SEP model`.
pub(super) fn route(p: &str, m: &str) -> String {
    format!("{}{SEP}{}", esc(p), esc(m))
}

/// The route fields that end a value, as read.
fn parse_route(p: &str, m: &str) -> (Arc<str>, Arc<str>) {
    (Arc::from(unesc(p)), Arc::from(unesc(m)))
}

fn opt(v: Option<&str>) -> String {
    match v {
        None => "-".to_string(),
        Some(s) => format!("+{}", esc(s)),
    }
}

fn unopt(s: &str) -> Option<String> {
    s.strip_prefix('+').map(unesc)
}

fn opt_i64(v: Option<i64>) -> String {
    v.map_or_else(String::new, |v| v.to_string())
}

pub(super) fn parse_i64(s: &str) -> StoreResult<i64> {
    s.parse().map_err(|_| unavailable(format!("unexpected number {s:?} in a stored value")))
}

fn parse_f64(s: &str) -> StoreResult<f64> {
    s.parse().map_err(|_| unavailable(format!("unexpected number {s:?} in a stored value")))
}

fn parse_opt_i64(s: &str) -> StoreResult<Option<i64>> {
    if s.is_empty() {
        Ok(None)
    } else {
        parse_i64(s).map(Some)
    }
}

fn split(s: &str, n: usize) -> StoreResult<Vec<&str>> {
    let parts: Vec<&str> = s.splitn(n, SEP).collect();
    if parts.len() != n {
        return Err(unavailable(format!("malformed stored value {s:?}")));
    }
    Ok(parts)
}

// ---- usage: a feed entry -----------------------------------------------------------

/// One usage feed entry after its writer: `U key kind amount created platform model`,
/// where the amount of a request entry (`r`) is how many requests it stands for
/// (more than 1 only for events merged while degraded) and that of a tokens entry
/// (`t`) its tokens; a priced event's kind carries its cost in µ$ (`r$150`, SPEC
/// 23.1), then the tenants it was served for, each after `RS` (`r$150\x1euser:a`,
/// SPEC 23.2).
fn usage_entry(u: &UsageRow) -> String {
    let (kind, amount) = match u.kind {
        UsageKind::Request => ("r", u.count.max(1).to_string()),
        UsageKind::Tokens => ("t", usage_amount(u)),
    };
    let mut kind = if u.cost == 0 { kind.to_string() } else { format!("{kind}${}", u.cost) };
    kind.push_str(&tenants_suffix(&u.tenants));
    format!(
        "U{SEP}{}{SEP}{kind}{SEP}{amount}{SEP}{}{SEP}{}",
        u.key_id,
        u.created_at_ms,
        route(&u.platform, &u.model_id)
    )
}

/// A tokens entry's amount: `total`, or `total,input,output,cached` with `-` for a
/// part the call did not report (SPEC §14.4).
fn usage_amount(u: &UsageRow) -> String {
    if u.kinds.is_empty() {
        return u.tokens.to_string();
    }
    let part = |v: Option<i64>| v.map_or_else(|| "-".to_string(), |v| v.to_string());
    format!("{},{},{},{}", u.tokens, part(u.kinds.input), part(u.kinds.output), part(u.kinds.cached))
}

/// See [`usage_entry`].
pub(super) fn parse_usage(body: &str) -> StoreResult<UsageRow> {
    let f = split(body, 7)?;
    let (platform, model_id) = parse_route(f[5], f[6]);
    let mut parts = f[3].split(',');
    let amount = parse_i64(parts.next().unwrap_or_default())?;
    let mut part = || -> StoreResult<Option<i64>> {
        match parts.next() {
            None | Some("-") => Ok(None),
            Some(v) => parse_i64(v).map(Some),
        }
    };
    let kinds = TokenKinds { input: part()?, output: part()?, cached: part()? };
    let (kind, tenants) = split_tenants(f[2]);
    let (kind, cost) = kind.split_once('$').unwrap_or((kind, "0"));
    let request = kind == "r";
    Ok(UsageRow {
        platform,
        model_id,
        key_id: parse_i64(f[1])?,
        kind: if request { UsageKind::Request } else { UsageKind::Tokens },
        tokens: if request { 0 } else { amount },
        count: if request { amount.max(1) } else { 1 },
        created_at_ms: parse_i64(f[4])?,
        kinds,
        cost: parse_i64(cost)?,
        tenants,
    })
}

// ---- leases ------------------------------------------------------------------------

/// A lease value: `key expires tokens[,output[,cost]] created platform model`, the
/// cost the µ$ it reserves (SPEC 23.1); the amounts are followed by the tenants it is
/// taken for, each after `RS` (SPEC 23.2).
fn lease_value(l: &LeaseRow) -> String {
    let mut tokens = match (l.output_tokens, l.cost) {
        (0, 0) => l.tokens.to_string(),
        (output, 0) => format!("{},{output}", l.tokens),
        (output, cost) => format!("{},{output},{cost}", l.tokens),
    };
    tokens.push_str(&tenants_suffix(&l.tenants));
    format!(
        "{}{SEP}{}{SEP}{tokens}{SEP}{}{SEP}{}",
        l.key_id,
        l.expires_at_ms,
        l.created_at_ms,
        route(&l.platform, &l.model_id)
    )
}

pub(super) fn parse_lease(id: i64, v: &str) -> StoreResult<LeaseRow> {
    let f = split(v, 6)?;
    let (platform, model_id) = parse_route(f[4], f[5]);
    let (amounts, tenants) = split_tenants(f[2]);
    let mut amounts = amounts.split(',');
    let (tokens, output, cost) =
        (amounts.next().unwrap_or_default(), amounts.next().unwrap_or("0"), amounts.next().unwrap_or("0"));
    Ok(LeaseRow {
        id,
        platform,
        model_id,
        key_id: parse_i64(f[0])?,
        tokens: parse_i64(tokens)?,
        output_tokens: parse_i64(output)?,
        cost: parse_i64(cost)?,
        created_at_ms: parse_i64(f[3])?,
        expires_at_ms: parse_i64(f[1])?,
        tenants,
    })
}

// ---- tenant declarations: `tenant` -> `tz limits` (SPEC 23.2) -------------------------

/// Its zone ([`opt`]) and its limits in the form of `encode_limits`.
fn tenant_limits_value(t: &TenantLimitsRow) -> String {
    format!("{}{SEP}{}", opt(t.tz.as_deref()), encode_limits(&t.limits))
}

/// See [`tenant_limits_value`]; a value a plain writer spoiled declares no limits.
fn parse_tenant_limits(field: &str, v: &str) -> TenantLimitsRow {
    let (tz, limits) = v.split_once(SEP).unwrap_or(("-", ""));
    TenantLimitsRow { tenant: unesc(field), limits: decode_limits(limits).unwrap_or_default(), tz: unopt(tz) }
}

// ---- cooldowns: `key platform model` -> `expires source set_at` ----------------------

/// A cooldown's field: its key (empty for a model-wide bench, SPEC 21.1) and route.
fn cooldown_field(key_id: Option<i64>, platform: &str, model_id: &str) -> String {
    let key = key_id.map(|k| k.to_string()).unwrap_or_default();
    format!("{key}{SEP}{}", route(platform, model_id))
}

fn cooldown_value(c: &CooldownRow) -> String {
    format!("{}{SEP}{}{SEP}{}", c.expires_at_ms, c.source.as_str(), c.set_at_ms)
}

fn parse_cooldown(field: &str, v: &str) -> StoreResult<CooldownRow> {
    let k = split(field, 3)?;
    let f = split(v, 3)?;
    let (platform, model_id) = parse_route(k[1], k[2]);
    Ok(CooldownRow {
        platform,
        model_id,
        // An empty key: the model-wide bench of SPEC 21.1.
        key_id: if k[0].is_empty() { None } else { Some(parse_i64(k[0])?) },
        expires_at_ms: parse_i64(f[0])?,
        source: f[1].parse().unwrap_or(CooldownSource::Heuristic),
        set_at_ms: parse_i64(f[2])?,
    })
}

// ---- keys: `key_id` -> `key enabled base_url label platform account cap` ---------------

fn key_value(k: &KeyInfo) -> String {
    format!(
        "{}{SEP}{}{SEP}{}{SEP}{}{SEP}{}{SEP}{}{SEP}{}",
        k.key_id,
        if k.enabled { "1" } else { "0" },
        opt(k.base_url.as_deref()),
        opt(k.label.as_deref()),
        esc(&k.platform),
        opt(k.account.as_deref()),
        opt_i64(k.concurrency_cap)
    )
}

fn parse_key(v: &str) -> StoreResult<KeyInfo> {
    // Five fields before accounts; the sixth is the account (SPEC §14.3), the
    // seventh the configured concurrency cap (SPEC 20; empty: none).
    let f: Vec<&str> = v.splitn(7, SEP).collect();
    if f.len() < 5 {
        return Err(unavailable(format!("malformed stored value {v:?}")));
    }
    Ok(KeyInfo {
        key_id: parse_i64(f[0])?,
        enabled: f[1] == "1",
        base_url: unopt(f[2]),
        label: unopt(f[3]),
        platform: unesc(f[4]),
        account: f.get(5).and_then(|a| unopt(a)),
        concurrency_cap: match f.get(6) {
            Some(c) if !c.is_empty() => Some(parse_i64(c)?),
            _ => None,
        },
    })
}

// ---- models: `platform model` -> the classic four (gate order), budget, the others --

fn model_value(m: &ModelInfo) -> String {
    let [a, b, c, d] = m.limits.classic();
    format!(
        "{}{SEP}{}{SEP}{}{SEP}{}{SEP}{}{SEP}{}",
        opt_i64(a),
        opt_i64(b),
        opt_i64(c),
        opt_i64(d),
        opt(m.monthly_token_budget.as_deref()),
        encode_limits(&m.limits.others())
    )
}

fn parse_model(field: &str, v: &str) -> StoreResult<ModelInfo> {
    let k = split(field, 2)?;
    // Five fields before limits as data; the sixth lists the other limits.
    let mut f: Vec<&str> = v.splitn(6, SEP).collect();
    if f.len() == 5 {
        f.push("");
    }
    if f.len() != 6 {
        return Err(unavailable(format!("malformed stored value {v:?}")));
    }
    Ok(ModelInfo {
        platform: unesc(k[0]),
        model_id: unesc(k[1]),
        limits: LimitSet::stored(
            [parse_opt_i64(f[0])?, parse_opt_i64(f[1])?, parse_opt_i64(f[2])?, parse_opt_i64(f[3])?],
            decode_limits(f[5]).unwrap_or_default(),
        ),
        monthly_token_budget: unopt(f[4]),
    })
}

// ---- provider caps: `platform` -> the declaration ([`encode_caps`]) ----------------
// Data written before it holds `daily minute tokens` (empty inherits, -1 no cap); it
// is still read.

fn caps_value(c: &CapOverrides) -> String {
    encode_caps(c)
}

fn parse_caps(field: &str, v: &str) -> StoreResult<(String, CapOverrides)> {
    if !v.contains(SEP) {
        let caps = decode_caps(v).map_err(|e| unavailable(format!("unexpected provider caps: {e}")))?;
        return Ok((unesc(field), caps));
    }
    let setting = |s: &str| -> StoreResult<CapSetting> {
        Ok(match parse_opt_i64(s)? {
            None => CapSetting::Inherit,
            Some(v) if v < 0 => CapSetting::NoCap,
            Some(v) => CapSetting::Cap(v),
        })
    };
    let f = split(v, 3)?;
    Ok((unesc(field), [setting(f[0])?, setting(f[1])?, setting(f[2])?]))
}

// ---- model prices: `platform SEP model` -> `input output cached_input per_request` (p$) --

fn prices_value(p: &Prices) -> String {
    format!("{}{SEP}{}{SEP}{}{SEP}{}", p.input, p.output, p.cached_input, p.per_request)
}

fn parse_prices(field: &str, v: &str) -> StoreResult<(String, String, Prices)> {
    let k = split(field, 2)?;
    let f = split(v, 4)?;
    let p = |s: &str| -> StoreResult<i64> {
        let n = parse_i64(s)?;
        if n < 0 {
            return Err(unavailable(format!("malformed stored prices {v:?}")));
        }
        Ok(n)
    };
    let prices = Prices { input: p(f[0])?, output: p(f[1])?, cached_input: p(f[2])?, per_request: p(f[3])? };
    Ok((unesc(k[0]), unesc(k[1]), prices))
}

// ---- failure history ---------------------------------------------------------------

/// `key kind[:value] hit_at platform model`: a row that carries a value (a learned
/// concurrency cap) holds it after its kind, where an engine that does not know the
/// kind skips the row whole.
fn history_value(h: &HistoryRow) -> String {
    let kind = match h.value {
        Some(n) => format!("{}:{n}", h.kind.as_str()),
        None => h.kind.as_str().to_string(),
    };
    format!("{}{SEP}{kind}{SEP}{}{SEP}{}", h.key_id, h.hit_at_ms, route(&h.platform, &h.model_id))
}

/// See [`history_value`].
fn parse_history(v: &str) -> StoreResult<Option<HistoryRow>> {
    let f = split(v, 5)?;
    let (kind, value) = match f[1].split_once(':') {
        Some((k, n)) => (k, Some(parse_i64(n)?)),
        None => (f[1], None),
    };
    let Some(kind) = HistoryKind::parse(kind) else { return Ok(None) };
    let (platform, model_id) = parse_route(f[3], f[4]);
    Ok(Some(HistoryRow {
        platform,
        model_id,
        key_id: parse_i64(f[0])?,
        kind,
        hit_at_ms: parse_i64(f[2])?,
        value,
    }))
}

// ---- observed quota: `key platform pool metric` -> `limit remaining reset conf at source`

fn quota_field(q: &QuotaStateRow) -> String {
    format!("{}{SEP}{}{SEP}{}{SEP}{}", q.key_id, esc(&q.platform), esc(&q.pool_key), esc(&q.metric))
}

fn quota_value(q: &QuotaStateRow) -> String {
    format!(
        "{}{SEP}{}{SEP}{}{SEP}{}{SEP}{}{SEP}{}",
        opt_i64(q.limit),
        opt_i64(q.remaining),
        opt_i64(q.reset_at_ms),
        q.confidence,
        q.observed_at_ms,
        esc(&q.source)
    )
}

pub(super) fn parse_quota(field: &str, v: &str) -> StoreResult<QuotaStateRow> {
    let k = split(field, 4)?;
    let f = split(v, 6)?;
    Ok(QuotaStateRow {
        platform: unesc(k[1]),
        key_id: parse_i64(k[0])?,
        pool_key: unesc(k[2]),
        metric: unesc(k[3]),
        limit: parse_opt_i64(f[0])?,
        remaining: parse_opt_i64(f[1])?,
        reset_at_ms: parse_opt_i64(f[2])?,
        confidence: f[3].parse().unwrap_or(0.0),
        observed_at_ms: parse_i64(f[4])?,
        source: unesc(f[5]),
    })
}

// ---- server_logs: `level source provider model event created message` (the script
// puts the row's id in front) -----------------------------------------------------------

fn log_value(l: &LogRow) -> String {
    format!(
        "{}{SEP}{}{SEP}{}{SEP}{}{SEP}{}{SEP}{}{SEP}{}",
        l.level,
        esc(&l.source),
        opt(l.provider.as_deref()),
        opt(l.model.as_deref()),
        opt(l.event.as_deref()),
        l.created_at_ms,
        esc(&l.message)
    )
}

/// `id` then what [`log_value`] wrote.
pub(super) fn parse_log(v: &str) -> StoreResult<(i64, LogRow, Option<String>)> {
    let f = split(v, 8)?;
    let level = match f[1] {
        "error" => "error",
        "warn" => "warn",
        _ => "info",
    };
    Ok((
        parse_i64(f[0])?,
        LogRow {
            level,
            source: unesc(f[2]),
            provider: unopt(f[3]),
            model: unopt(f[4]),
            event: unopt(f[5]),
            created_at_ms: parse_i64(f[6])?,
            message: unesc(f[7]),
        },
        None,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_separators_round_trip() {
        for s in ["plain", "a\u{1f}b", "back\\slash", "\\u", "\u{1f}\\\u{1f}", ""] {
            assert_eq!(unesc(&esc(s)), s);
            assert!(!esc(s).contains(SEP));
        }
        let row = parse_usage(&format!("U{SEP}7{SEP}r{SEP}1{SEP}42{SEP}{}", route("p\u{1f}x", "m\\y")))
            .expect("parses");
        assert_eq!(
            (&*row.platform, &*row.model_id, row.key_id, row.created_at_ms),
            ("p\u{1f}x", "m\\y", 7, 42)
        );
    }

    /// SPEC 23.2: a usage entry's and a lease's tenants read back exactly, whatever
    /// their names hold; each escaped name holds neither separator.
    #[test]
    fn tenants_round_trip_in_usage_entries_and_leases() {
        let names = ["user:a", "a\u{1f}b", "c\u{1e}d", "back\\slash", "\\u\\r\\", "é🦀 中文", "r$5,6", "-"];
        for n in names {
            let e = esc_tenant(n);
            assert!(!e.contains(SEP) && !e.contains(RS), "{n:?} -> {e:?}");
            assert_eq!(unesc(&e), n);
            assert!(tenant_watch(n).starts_with(RS), "never an account: those start with a number");
        }
        let all: TenantList = names.iter().map(|n| Arc::from(*n)).collect();
        let one: TenantList = Arc::from(vec![Arc::from("team:x")]);
        let u = UsageRow {
            platform: Arc::from("p\u{1e}x"),
            model_id: Arc::from("m"),
            key_id: 7,
            kind: UsageKind::Request,
            tokens: 0,
            count: 3,
            created_at_ms: 42,
            kinds: TokenKinds::default(),
            cost: 0,
            tenants: all.clone(),
        };
        let tokens = UsageRow {
            kind: UsageKind::Tokens,
            tokens: 30,
            count: 1,
            kinds: TokenKinds { input: Some(20), output: Some(10), cached: None },
            ..u.clone()
        };
        for row in [
            u.clone(),
            UsageRow { cost: 150, ..u.clone() },
            UsageRow { tenants: one.clone(), ..u.clone() },
            tokens.clone(),
            UsageRow { cost: 9, tenants: one.clone(), ..tokens.clone() },
        ] {
            let body = usage_entry(&row);
            assert_eq!(parse_usage(&body).expect("usage"), row, "{body:?}");
        }
        // Without tenants, an entry is as it was.
        let plain = UsageRow { tenants: crate::core::tenants::none(), ..u.clone() };
        assert_eq!(usage_entry(&plain), format!("U{SEP}7{SEP}r{SEP}3{SEP}42{SEP}p\u{1e}x{SEP}m"));
        assert_eq!(
            usage_entry(&UsageRow { cost: 5, tenants: one.clone(), ..plain.clone() }),
            format!("U{SEP}7{SEP}r$5{RS}team:x{SEP}3{SEP}42{SEP}p\u{1e}x{SEP}m")
        );
        let l = LeaseRow {
            id: 9,
            platform: Arc::from("p"),
            model_id: Arc::from("m\u{1f}y"),
            key_id: 7,
            tokens: 100,
            output_tokens: 0,
            cost: 0,
            created_at_ms: 1,
            expires_at_ms: 2,
            tenants: all.clone(),
        };
        for lease in [
            l.clone(),
            LeaseRow { output_tokens: 40, ..l.clone() },
            LeaseRow { output_tokens: 40, cost: 1_234, ..l.clone() },
            LeaseRow { cost: 5, tenants: one.clone(), ..l.clone() },
        ] {
            assert_eq!(parse_lease(9, &lease_value(&lease)).expect("lease"), lease);
        }
        assert_eq!(
            lease_value(&LeaseRow { tenants: one, ..l }),
            format!("7{SEP}2{SEP}100{RS}team:x{SEP}1{SEP}p{SEP}m\\uy")
        );
    }

    /// SPEC 23.2: a tenant's (or a pattern's) declaration, its zone optional.
    #[test]
    fn tenant_declarations_read_back() {
        let lim = |m: &str, n: i64, per: &str| {
            crate::core::limits::Limit::parse(m, n, per, "account").expect("limit")
        };
        for t in [
            TenantLimitsRow {
                tenant: "team:*".into(),
                limits: vec![lim("cost", 5_000_000, "day")],
                tz: None,
            },
            TenantLimitsRow {
                tenant: "user\u{1f}a\\".into(),
                limits: vec![lim("requests", 10, "minute"), lim("tokens", 1000, "month")],
                tz: Some("Europe/Paris".into()),
            },
        ] {
            assert_eq!(parse_tenant_limits(&esc(&t.tenant), &tenant_limits_value(&t)), t);
        }
        // A value a plain writer spoiled declares no limits.
        let spoiled = parse_tenant_limits("x", "nonsense");
        assert_eq!((spoiled.limits.len(), spoiled.tz), (0, None));
    }

    /// Each kind's encoder and decoder agree (the script stores the value as given;
    /// a log row gets its id in front).
    #[test]
    fn every_kind_reads_back_what_it_wrote() {
        let (p, m): (Arc<str>, Arc<str>) = (Arc::from("p\u{1f}x"), Arc::from("m\\y"));
        let u = UsageRow {
            platform: p.clone(),
            model_id: m.clone(),
            key_id: 7,
            kind: UsageKind::Tokens,
            tokens: 30,
            count: 1,
            created_at_ms: 42,
            kinds: TokenKinds { input: Some(20), output: None, cached: Some(5) },
            cost: 0,
            tenants: crate::core::tenants::none(),
        };
        let body = usage_entry(&u);
        assert_eq!(parse_usage(&body).expect("usage"), u);
        // A priced event, a request and a tokens entry (SPEC 23.1).
        for priced in [
            UsageRow { cost: 2_345, ..u.clone() },
            UsageRow {
                kind: UsageKind::Request,
                tokens: 0,
                count: 2,
                kinds: TokenKinds::default(),
                cost: 9,
                ..u.clone()
            },
        ] {
            assert_eq!(parse_usage(&usage_entry(&priced)).expect("priced usage"), priced);
        }
        let l = LeaseRow {
            id: 9,
            platform: p.clone(),
            model_id: m.clone(),
            key_id: 7,
            tokens: 100,
            output_tokens: 40,
            cost: 0,
            created_at_ms: 1,
            expires_at_ms: 2,
            tenants: crate::core::tenants::none(),
        };
        assert_eq!(parse_lease(9, &lease_value(&l)).expect("lease"), l);
        for priced in
            [LeaseRow { cost: 1_234, ..l.clone() }, LeaseRow { cost: 5, output_tokens: 0, ..l.clone() }]
        {
            assert_eq!(parse_lease(9, &lease_value(&priced)).expect("priced lease"), priced);
        }
        let c = CooldownRow {
            platform: p.clone(),
            model_id: m.clone(),
            key_id: Some(7),
            expires_at_ms: 5,
            source: CooldownSource::Authoritative,
            set_at_ms: 3,
        };
        let field = cooldown_field(c.key_id, &c.platform, &c.model_id);
        assert_eq!(parse_cooldown(&field, &cooldown_value(&c)).expect("cooldown"), c);
        let k = KeyInfo {
            key_id: 7,
            platform: "p\u{1f}x".into(),
            base_url: Some("http://h".into()),
            label: None,
            enabled: false,
            account: Some("acct".into()),
            concurrency_cap: Some(3),
        };
        assert_eq!(parse_key(&key_value(&k)).expect("key"), k);
        let mi = ModelInfo {
            platform: "p\u{1f}x".into(),
            model_id: "m\\y".into(),
            limits: LimitSet::from_classic([Some(1), None, Some(3), None]),
            monthly_token_budget: Some("5".into()),
        };
        assert_eq!(parse_model(&route(&mi.platform, &mi.model_id), &model_value(&mi)).expect("model"), mi);
        let caps: CapOverrides = [CapSetting::Cap(4), CapSetting::NoCap, CapSetting::Inherit];
        assert_eq!(
            parse_caps(&esc("p\u{1f}x"), &caps_value(&caps)).expect("caps"),
            ("p\u{1f}x".into(), caps)
        );
        assert_eq!(caps_value(&caps), "requests/day=4 requests/minute=none");
        // as written before the declaration
        let old = format!("4{SEP}-1{SEP}");
        assert_eq!(parse_caps("p", &old).expect("old caps"), ("p".into(), caps));
        let h = HistoryRow {
            platform: p.clone(),
            model_id: Arc::from(""),
            key_id: 7,
            kind: HistoryKind::Concurrency,
            hit_at_ms: 11,
            value: Some(2),
        };
        assert_eq!(parse_history(&history_value(&h)).expect("history"), Some(h));
        let q = QuotaStateRow {
            platform: "p".into(),
            key_id: 7,
            pool_key: "pool".into(),
            metric: "requests".into(),
            limit: Some(10),
            remaining: None,
            reset_at_ms: Some(99),
            source: "header".into(),
            confidence: 0.75,
            observed_at_ms: 12,
        };
        assert_eq!(parse_quota(&quota_field(&q), &quota_value(&q)).expect("quota"), q);
        let g = LogRow {
            level: "warn",
            source: "quotaengine".into(),
            provider: None,
            model: Some("m".into()),
            event: Some("degraded".into()),
            message: "a\u{1f}b".into(),
            created_at_ms: 13,
        };
        assert_eq!(parse_log(&format!("4{SEP}{}", log_value(&g))).expect("log"), (4, g, None));
    }
}
