//! The one door into a section: [`Unit::run`] opens it as an [`Access`] asks, runs
//! the use case's body on a [`Tx`] (the mirror as of the section's `now`, and the
//! writes it queues), and ends it: the writes committed with the section, none when
//! the body fails.
use super::{Access, Unit};
use crate::core::error::Result;
use crate::core::state::Mirror;
use crate::core::store::Write;

/// A section's transaction: the mirror (synced with what other engines wrote) as of
/// `now`, and the writes the body queues.
pub(crate) struct Tx<'u> {
    unit: &'u mut Unit,
    now: i64,
    /// The store answered when the section opened.
    online: bool,
    writes: Vec<Write>,
}

impl Tx<'_> {
    /// The section's time, read once the store's lock was taken.
    pub(crate) fn now(&self) -> i64 {
        self.now
    }

    /// The store answered when the section opened (else it serves from memory).
    pub(crate) fn online(&self) -> bool {
        self.online
    }

    pub(crate) fn mirror(&mut self) -> &mut Mirror {
        &mut self.unit.mirror
    }

    /// Queues a write, committed with the section (and applied to the mirror then).
    pub(crate) fn push(&mut self, w: Write) {
        self.writes.push(w);
    }

    /// The unit the section runs in (a decision prepared, a desk's helpers), its time
    /// and the writes queued so far.
    pub(crate) fn parts(&mut self) -> (&mut Unit, i64, &mut Vec<Write>) {
        (self.unit, self.now, &mut self.writes)
    }
}

impl Unit {
    /// Runs `f` in one section opened as `access` asks: `f` reads the mirror as of the
    /// section's `now` and queues its writes, committed with the section; when `f`
    /// fails, none of them is. Returns what `f` answers.
    pub(crate) fn run<T>(&mut self, access: Access, f: impl FnOnce(&mut Tx<'_>) -> Result<T>) -> Result<T> {
        self.run_counted(access, f).map(|(out, _)| out)
    }

    /// [`Unit::run`], also returning, per write, the id of an insert or the number of
    /// rows a delete removed.
    pub(crate) fn run_counted<T>(
        &mut self, access: Access, f: impl FnOnce(&mut Tx<'_>) -> Result<T>,
    ) -> Result<(T, Vec<i64>)> {
        let sec = self.enter(access)?;
        let mut tx = Tx { unit: self, now: sec.now, online: sec.online, writes: Vec::new() };
        match f(&mut tx) {
            Ok(out) => {
                let writes = tx.writes;
                Ok((out, self.leave(sec, writes)?))
            }
            Err(e) => {
                self.leave(sec, Vec::new())?;
                Err(e)
            }
        }
    }
}
