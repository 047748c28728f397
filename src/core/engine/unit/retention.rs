//! What the retention sweep keeps (SPEC 10, 14.2).
use crate::core::store::{KeptUsage, UsageRow};
use std::sync::Arc;

/// The retention of usage at one time (SPEC 10, 14.2): rows stamped `before` or later
/// stay, and of a model in `kept`, those stamped at or after its own cut-off.
#[derive(Debug, Clone)]
pub(crate) struct Retention {
    pub before: i64,
    pub kept: Arc<[KeptUsage]>,
}

impl Retention {
    /// The oldest time of a row of this model that retention keeps.
    pub fn cutoff(&self, platform: &str, model_id: &str) -> i64 {
        crate::core::store::usage_cutoff(&self.kept, self.before, platform, model_id)
    }

    pub fn keeps(&self, u: &UsageRow) -> bool {
        u.created_at_ms >= self.cutoff(&u.platform, &u.model_id)
    }
}
