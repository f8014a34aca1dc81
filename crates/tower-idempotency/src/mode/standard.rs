//! The standard mode: the answer is saved with one store write of its own.

use std::sync::Arc;

use http::Extensions;

use super::{Mode, Sealed};
use crate::store::Store;

/// The default mode: the response is saved with one store write after the handler answers.
///
/// The handler's own side effects are not covered by that write: if the process dies between
/// the handler's work and the save, a retry after the lease runs the handler again. Use
/// [`Transactional`](crate::Transactional) mode to close that gap for database work.
#[derive(Debug, Clone, Copy, Default)]
pub struct Standard;

impl Sealed for Standard {}

/// The trait's default methods are this mode: nothing to keep for a run, no work to save the
/// answer with (it is saved on its own), nothing to undo, and an unsaved answer still reaches
/// the client (the work is done and cannot be undone).
impl<St: Store> Mode<St> for Standard {
    type RunState = ();

    fn begin_run(_: &Arc<St>, _: &mut Extensions, _: Option<()>) -> Self::RunState {}

    fn begin_unguarded(_: &Arc<St>, _: &mut Extensions) -> Self::RunState {}
}
