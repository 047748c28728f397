//! What the retention sweep keeps (SPEC 10, 14.2).
use crate::core::store::{KeptUsage, UsageRow};
use std::sync::Arc;

/// The retention of usage at one time (SPEC 10, 14.2): rows stamped `before` or later
/// stay, and of a model or tenant in `kept`, those stamped at or after its own cut-off.
#[derive(Debug, Clone)]
pub(crate) struct Retention {
    pub before: i64,
    pub kept: Arc<[KeptUsage]>,
}

impl Retention {
    pub fn keeps(&self, u: &UsageRow) -> bool {
        u.created_at_ms
            >= crate::core::store::usage_cutoff(&self.kept, self.before, &u.platform, &u.model_id, &u.tenants)
    }
}
