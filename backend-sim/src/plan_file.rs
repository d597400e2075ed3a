//! `ftsim plan`: reads a plan file (DESIGN.md's contract), builds the plan with
//! `ft-bcast`, checks it, and renders it as text, JSON or Graphviz.
//!
//! A plan file is a JSON object with `ranks`, `root`, `outputs` (each `name`, `bytes`,
//! `dests`), and optionally `failed` (default none), `topology` (`star`, `chain`,
//! `binomial` (default) or `kary:K`) and `strategy` (`per-class` (default),
//! `fetch-for-descendants`, `per-output`). Unknown fields are errors.
//!
//! Errors keep their causes apart: the file could not be read; it is not a plan file
//! (JSON syntax, a missing or unknown field, a value of the wrong type: with line and
//! column); or it describes an impossible broadcast (from [`PlanSpec`] validation).

use std::fmt::{self, Write as _};
use std::path::Path;

use ft_bcast::{CheckError, OutputSet, OutputSpec, Plan, PlanSpec, SpecError, Strategy, Topology};
use serde::de::{self, Deserializer};
use serde::Deserialize;

/// How `ftsim plan` renders a plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PlanFormat {
    /// Readable text (default): classes, trees, depth, bytes, activations.
    Text,
    /// The plan-result JSON contract: `{"edges": [[p, c, [names]]...], "stats": {...}}`.
    Json,
    /// Graphviz, one colour per output, edges labelled with the outputs they carry.
    Dot,
}

/// Why a plan file could not be turned into a plan.
#[derive(Debug)]
#[non_exhaustive]
pub enum PlanFileError {
    /// The file could not be read.
    Read(std::io::Error),
    /// The text is not a plan file: JSON syntax, a missing or unknown field, or a value
    /// of the wrong type (the message gives line and column).
    Parse(serde_json::Error),
    /// The plan file is well-formed but describes an impossible broadcast.
    Spec(SpecError),
    /// The built plan breaks an invariant: a bug in `ft-bcast`, never the file's fault.
    Check(CheckError),
}

impl fmt::Display for PlanFileError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanFileError::Read(e) => write!(f, "cannot read the plan file: {e}"),
            PlanFileError::Parse(e) => write!(f, "not a valid plan file: {e}"),
            PlanFileError::Spec(e) => write!(f, "invalid plan: {e}"),
            PlanFileError::Check(e) => {
                write!(f, "internal error, the built plan is wrong: {e}")
            }
        }
    }
}

impl std::error::Error for PlanFileError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PlanFileError::Read(e) => Some(e),
            PlanFileError::Parse(e) => Some(e),
            PlanFileError::Spec(e) => Some(e),
            PlanFileError::Check(e) => Some(e),
        }
    }
}

/// Reads the plan file at `path`, builds and checks the plan, and renders it in
/// `format`.
pub fn run(path: &Path, format: PlanFormat) -> Result<String, PlanFileError> {
    let text = std::fs::read_to_string(path).map_err(PlanFileError::Read)?;
    let plan = build(&text)?;
    Ok(render(&plan, format))
}

/// Parses plan-file text into a spec (not yet validated: see [`build`]).
pub fn parse(text: &str) -> Result<PlanSpec, PlanFileError> {
    let file: PlanFile = serde_json::from_str(text).map_err(PlanFileError::Parse)?;
    let spec = PlanSpec::new(file.ranks, file.root)
        .with_topology(file.topology)
        .with_strategy(file.strategy)
        .with_failed(&file.failed)
        .map_err(PlanFileError::Spec)?;
    Ok(PlanSpec {
        outputs: file
            .outputs
            .into_iter()
            .map(|o| OutputSpec::new(o.name, o.bytes, o.dests))
            .collect(),
        ..spec
    })
}

/// Parses plan-file text, builds the plan and checks it.
pub fn build(text: &str) -> Result<Plan, PlanFileError> {
    let plan = Plan::build(parse(text)?).map_err(PlanFileError::Spec)?;
    plan.check().map_err(PlanFileError::Check)?;
    Ok(plan)
}

/// Renders a plan in `format`.
pub fn render(plan: &Plan, format: PlanFormat) -> String {
    match format {
        PlanFormat::Text => render_text(plan),
        PlanFormat::Json => render_json(plan),
        PlanFormat::Dot => render_dot(plan),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanFile {
    ranks: u32,
    root: u32,
    #[serde(default)]
    failed: Vec<u32>,
    #[serde(default = "default_topology", deserialize_with = "from_name")]
    topology: Topology,
    #[serde(default, deserialize_with = "from_name")]
    strategy: Strategy,
    outputs: Vec<OutputEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct OutputEntry {
    name: String,
    bytes: u64,
    dests: Vec<u32>,
}

fn default_topology() -> Topology {
    Topology::Binomial
}

/// A field given by name (`"binomial"`, `"per-class"`), parsed in place so a bad name
/// gets the line and column of the value.
fn from_name<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: std::str::FromStr,
    T::Err: fmt::Display,
{
    let name = String::deserialize(d)?;
    name.parse()
        .map_err(|e| de::Error::custom(format!("{e}, not {name:?}")))
}

fn output_names<'a>(plan: &'a Plan, set: &OutputSet) -> Vec<&'a str> {
    set.iter()
        .filter_map(|j| plan.spec().outputs.get(j as usize))
        .map(|o| &*o.name)
        .collect()
}

fn render_json(plan: &Plan) -> String {
    let quote = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| String::from("\"?\""));
    let mut out = String::from("{\n  \"edges\": [");
    for (k, e) in plan.edges().enumerate() {
        let names: Vec<String> = output_names(plan, e.outputs)
            .into_iter()
            .map(quote)
            .collect();
        let sep = if k == 0 { "\n" } else { ",\n" };
        let _ = write!(
            out,
            "{sep}    [{}, {}, [{}]]",
            e.parent,
            e.child,
            names.join(", ")
        );
    }
    if plan.stats().activations > 0 {
        out.push_str("\n  ");
    }
    let s = plan.stats();
    let _ = writeln!(
        out,
        "],\n  \"stats\": {{\"trees\": {}, \"activations\": {}, \"bytes\": {}, \"max_depth\": {}}}\n}}",
        s.trees, s.activations, s.bytes, s.max_depth
    );
    out
}

/// Ten distinct colours, then evenly spread hues.
fn colour(output: u32) -> String {
    const PALETTE: [&str; 10] = [
        "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
        "#bcbd22", "#17becf",
    ];
    match PALETTE.get(output as usize) {
        Some(c) => String::from(*c),
        None => {
            let hue = (f64::from(output) * 0.618_033_988_75).fract();
            format!("{hue:.3} 0.750 0.800")
        }
    }
}

fn dot_escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"")
}

fn render_dot(plan: &Plan) -> String {
    let spec = plan.spec();
    let mut out = String::from("digraph plan {\n");
    let _ = writeln!(
        out,
        "  // {} ranks, root {}, topology {}, strategy {}",
        spec.ranks, spec.root, spec.topology, spec.strategy
    );
    out.push_str("  node [shape=circle, fontname=\"Helvetica\"];\n");
    out.push_str("  edge [fontname=\"Helvetica\", fontsize=10];\n");
    let _ = writeln!(
        out,
        "  {} [shape=doublecircle, label=\"{0}\\nroot\"];",
        spec.root
    );
    for r in plan.unreachable() {
        let _ = writeln!(
            out,
            "  {r} [style=dashed, color=gray50, fontcolor=gray50, label=\"{r}\\nfailed\"];"
        );
    }
    for e in plan.edges() {
        let names: Vec<String> = output_names(plan, e.outputs)
            .into_iter()
            .map(dot_escape)
            .collect();
        let colours: Vec<String> = e.outputs.iter().map(colour).collect();
        let _ = writeln!(
            out,
            "  {} -> {} [label=\"{}\", color=\"{}\"];",
            e.parent,
            e.child,
            names.join(","),
            colours.join(":")
        );
    }
    out.push_str("  subgraph cluster_legend {\n    label=\"outputs\";\n    node [shape=box, style=filled, fontcolor=white];\n");
    for (j, o) in spec.outputs.iter().enumerate() {
        let _ = writeln!(
            out,
            "    legend_{j} [fillcolor=\"{}\", label=\"{} ({} B)\"];",
            colour(j as u32),
            dot_escape(&o.name),
            o.bytes
        );
    }
    out.push_str("  }\n}\n");
    out
}

/// At most `limit` ranks, then how many more.
fn rank_list(ranks: &[u32], limit: usize) -> String {
    if ranks.is_empty() {
        return String::from("none");
    }
    let shown: Vec<String> = ranks.iter().take(limit).map(u32::to_string).collect();
    let mut s = shown.join(", ");
    if ranks.len() > limit {
        let _ = write!(s, ", ... (+{} more)", ranks.len() - limit);
    }
    s
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

fn render_text(plan: &Plan) -> String {
    const LIST: usize = 16;
    const ROWS: usize = 64;
    const EDGES: usize = 200;
    let spec = plan.spec();
    let set_names = |set: &OutputSet| format!("{{{}}}", output_names(plan, set).join(", "));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "plan: {} ranks, root {}, topology {}, strategy {}",
        spec.ranks, spec.root, spec.topology, spec.strategy
    );
    let _ = writeln!(out, "outputs ({}):", spec.outputs.len());
    for (j, o) in spec.outputs.iter().enumerate() {
        let _ = writeln!(
            out,
            "  #{j} {}: {} bytes -> {}",
            o.name,
            o.bytes,
            plural(o.dests.len(), "destination", "destinations")
        );
    }
    let failed: Vec<u32> = spec.failed.iter().collect();
    let _ = writeln!(out, "failed ranks: {}", rank_list(&failed, LIST));
    let _ = writeln!(
        out,
        "unreachable destinations (failed, skipped): {}",
        rank_list(plan.unreachable(), LIST)
    );
    let _ = writeln!(out, "classes ({}):", plan.classes().len());
    for (k, c) in plan.classes().iter().enumerate().take(ROWS) {
        let _ = writeln!(
            out,
            "  class {k} {}: {}: {}",
            set_names(c.outputs),
            plural(c.members.len(), "rank", "ranks"),
            rank_list(c.members, LIST)
        );
    }
    if plan.classes().len() > ROWS {
        let _ = writeln!(out, "  ... (+{} more classes)", plan.classes().len() - ROWS);
    }
    let show_edges = plan.stats().activations <= EDGES;
    let _ = writeln!(out, "trees ({}):", plan.trees().len());
    for (t, tree) in plan.trees().iter().enumerate().take(ROWS) {
        let _ = writeln!(
            out,
            "  tree {t} {}: {}, depth {}, {} bytes",
            set_names(&tree.outputs),
            plural(tree.len(), "activation", "activations"),
            tree.depth,
            tree.bytes
        );
        if show_edges {
            for e in plan.tree_edges(t) {
                let _ = writeln!(
                    out,
                    "    {} -> {} {}",
                    e.parent,
                    e.child,
                    set_names(e.outputs)
                );
            }
        }
    }
    if plan.trees().len() > ROWS {
        let _ = writeln!(out, "  ... (+{} more trees)", plan.trees().len() - ROWS);
    }
    if !show_edges {
        let _ = writeln!(
            out,
            "  ({} edges not listed; use --json or --dot)",
            plan.stats().activations
        );
    }
    let s = plan.stats();
    let _ = writeln!(
        out,
        "totals: trees {}, activations {}, bytes {}, max depth {}",
        s.trees, s.activations, s.bytes, s.max_depth
    );
    out
}
