//! One error type for the core; the binding maps it to Python exceptions in one place.

/// Why a store operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The file cannot be used as this engine's database (not SQLite, newer schema,
    /// another application's tables). Nothing in the file was changed.
    #[error("{0}")]
    Incompatible(String),
    /// A write on an engine opened read-only.
    #[error("the database was opened read-only")]
    ReadOnly,
    /// The database did not answer (locked past the busy timeout, I/O error, disk full...).
    #[error("{0}")]
    Unavailable(String),
    /// A commit whose reply never came (the connection was cut, the server
    /// restarted): the server may or may not have applied it. The store keeps its
    /// writes and sends them again, under the same identity so that they are applied
    /// at most once (SPEC 19.2), before anything else once the server answers: for
    /// the engine the writes are committed, and the store is failing meanwhile.
    #[error("{0}")]
    InDoubt(String),
    /// The server answered with an error that waiting will not cure (a key under the
    /// prefix holding the wrong type, a script error, a server too old): not an
    /// outage (SPEC 19.1). Raised from the call that met it.
    #[error("{0}")]
    Rejected(String),
    /// An optimistic section's decision rested on data another writer has since
    /// changed: nothing was written (see `Store::begin_optimistic`).
    #[error("another writer changed what the decision read")]
    Conflict,
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Unavailable(e.to_string())
    }
}

impl From<rusqlite::types::FromSqlError> for StoreError {
    fn from(e: rusqlite::types::FromSqlError) -> Self {
        StoreError::Unavailable(e.to_string())
    }
}

/// A refused admission: which gate, when it may open, for which route.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub reason: Reason,
    pub retry_at_ms: Option<i64>,
    pub platform: String,
    pub model_id: String,
    pub key_id: i64,
    /// The tenant whose limit refused (SPEC 23.2), `None` for the route's own gates.
    pub tenant: Option<String>,
    /// The scope of the declared limit that refused (`None` for the cooldown, the
    /// concurrency cap and an excluded candidate): what a waiter waits for (SPEC 24.5).
    pub scope: Option<crate::core::limits::Scope>,
    /// `lease_any` (SPEC 17.1): every candidate's refusal, in the given order (this one
    /// among them); empty for a `lease()` of one route, whose refusal is this one.
    pub candidates: Vec<Refusal>,
}

impl Refusal {
    /// What `lease_any` reports when no candidate passes: the refusal with the earliest
    /// known `retry_at_ms` (else the first), carrying all of them.
    pub fn of_candidates(all: Vec<Refusal>) -> Option<Refusal> {
        let head = all
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.retry_at_ms.map(|t| (t, i)))
            .min()
            .map_or(0, |(_, i)| i);
        let mut headline = all.get(head)?.clone();
        headline.candidates = all;
        Some(headline)
    }

    /// Every candidate's refusal (one entry for a `lease()`).
    pub fn all(&self) -> Vec<Refusal> {
        if self.candidates.is_empty() {
            vec![self.clone()]
        } else {
            self.candidates.clone()
        }
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Bad input: negative tokens, empty platform, unknown source... (Python: ValueError)
    #[error("{0}")]
    Invalid(String),
    /// A duration or time beyond what the engine can represent (Python: OverflowError).
    #[error("{0}")]
    Overflow(String),
    /// `lease()` refused (Python: QuotaExceeded).
    #[error("{}/{}/{}: quota exceeded ({})", .0.platform, .0.model_id, .0.key_id, .0.reason.as_str())]
    Refused(Box<Refusal>),
    /// A call the engine cannot serve from where it is made: `run_probe_pass()` from
    /// inside a running pass (SPEC 18.3; Python: RuntimeError).
    #[error("{0}")]
    Runtime(String),
    /// A call after `close()` (Python: EngineClosed).
    #[error("engine is closed")]
    Closed,
    /// The database cannot be used (Python: DatabaseError).
    #[error("database: {0}")]
    Store(#[from] StoreError),
    /// A caught panic or a broken invariant (Python: QuotaEngineError).
    #[error("internal error: {0}")]
    Internal(String),
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn invalid(msg: impl Into<String>) -> Self {
        Error::Invalid(msg.into())
    }
    /// Turns a caught panic payload into an ordinary error.
    pub fn from_panic(payload: Box<dyn std::any::Any + Send>) -> Self {
        let msg = if let Some(s) = payload.downcast_ref::<&str>() {
            (*s).to_string()
        } else if let Some(s) = payload.downcast_ref::<String>() {
            s.clone()
        } else {
            "panic".to_string()
        };
        Error::Internal(msg)
    }
}

/// Rejects an empty name (SPEC §13).
pub fn check_name(what: &str, value: &str) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid(format!("{what} must be a non-empty string")));
    }
    Ok(())
}

/// Rejects a negative amount (tokens, durations, limits).
pub fn check_non_negative(what: &str, value: i64) -> Result<i64> {
    if value < 0 {
        return Err(Error::invalid(format!("{what} must be >= 0, got {value}")));
    }
    Ok(value)
}

/// Why a gate refused (SPEC §4, §14.1): the cooldown, the key's concurrency, or a
/// declared limit by the name its `Declared` carries (SPEC §4's classic four and §8's
/// provider caps by their names, any other limit by its metric and window, e.g.
/// `"requests/1s"`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Reason {
    Cooldown,
    KeyConcurrency,
    /// SPEC 24.7: a candidate `lease_any`'s `exclude` covers (its gates never ran).
    Excluded,
    Declared(std::sync::Arc<str>),
}

impl Reason {
    /// A declared limit's reason, by its name.
    pub fn declared(name: &str) -> Reason {
        Reason::Declared(std::sync::Arc::from(name))
    }

    pub fn as_str(&self) -> &str {
        match self {
            Reason::Declared(name) => name,
            Reason::Cooldown => "cooldown",
            Reason::KeyConcurrency => "key_concurrency",
            Reason::Excluded => "excluded",
        }
    }
}
