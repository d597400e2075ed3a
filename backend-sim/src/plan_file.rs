//! `ftsim plan`: reads a plan file (DESIGN.md's contract), builds the plan with
//! `ft-bcast`, and renders it as text, JSON or Graphviz.
//!
//! Placeholder until the plan builder lands: every call reports that it is not built.

use std::path::Path;

/// How `ftsim plan` renders a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanFormat {
    /// Readable text (default).
    Text,
    /// The plan-result JSON contract.
    Json,
    /// Graphviz, one colour per output.
    Dot,
}

/// Reads the plan file at `path` and renders the plan in `format`.
pub fn run(path: &Path, format: PlanFormat) -> Result<String, String> {
    let _ = (path, format);
    Err("ftsim plan is not built yet".into())
}
