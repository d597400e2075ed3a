//! [`PlanSpec`]: what a broadcast must achieve, and its validation.
//!
//! A task at rank `root` of a communicator of `ranks` ranks has outputs `O_1..O_m`;
//! output `O_j` (a name and a size in bytes) must reach the ranks `D_j`. Ranks in
//! `failed` are left out of every tree; destinations among them are reported as
//! unreachable.
//!
//! A valid spec has: `root < ranks`, `root` not failed, `failed` over `ranks` ranks,
//! non-empty distinct output names, and destination lists of ranks `< ranks`, without the
//! root and without repeats.

use alloc::borrow::Cow;
use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;
use core::str::FromStr;
use hashbrown::HashSet;

use ft_core::{FailureView, Rank, RankSet};

use crate::refine::{refine_without, Partition, RefineError};
use crate::topology::Topology;

/// Up to this many outputs, names are checked for repeats pairwise.
const PAIRWISE_NAMES: usize = 16;

/// How the activation trees of a broadcast are built.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Strategy {
    /// One tree per class of destinations needing the same outputs; every rank gets
    /// exactly what it needs in one activation (the default).
    #[default]
    PerClass,
    /// One merged tree over all destinations; each rank fetches the union of what its
    /// subtree needs (fewer trees, more bytes).
    FetchForDescendants,
    /// One tree per output; a rank gets one activation per output it needs.
    PerOutput,
}

impl Strategy {
    /// Every strategy.
    pub const ALL: [Strategy; 3] = [
        Strategy::PerClass,
        Strategy::FetchForDescendants,
        Strategy::PerOutput,
    ];

    /// The strategy's name in plan files.
    pub const fn name(self) -> &'static str {
        match self {
            Strategy::PerClass => "per-class",
            Strategy::FetchForDescendants => "fetch-for-descendants",
            Strategy::PerOutput => "per-output",
        }
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A strategy name that is not `per-class`, `fetch-for-descendants` or `per-output`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseStrategyError;

impl fmt::Display for ParseStrategyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("strategy must be one of per-class, fetch-for-descendants, per-output")
    }
}

#[cfg(feature = "std")]
impl std::error::Error for ParseStrategyError {}

impl FromStr for Strategy {
    type Err = ParseStrategyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Strategy::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or(ParseStrategyError)
    }
}

/// One output of the task.
///
/// The name is a `Cow<'static, str>`: a literal (`"A"`, the common case in code that
/// knows its outputs) is borrowed and costs no allocation per task; a name built at run
/// time (`format!`, a C string, a plan file) is owned, as before.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OutputSpec {
    /// Its name (non-empty, unique within the task).
    pub name: Cow<'static, str>,
    /// Its size in bytes.
    pub bytes: u64,
    /// The ranks that need it.
    pub dests: Vec<Rank>,
}

impl OutputSpec {
    /// An output `name` of `bytes` bytes for `dests`.
    pub fn new(
        name: impl Into<Cow<'static, str>>,
        bytes: u64,
        dests: impl Into<Vec<Rank>>,
    ) -> Self {
        OutputSpec {
            name: name.into(),
            bytes,
            dests: dests.into(),
        }
    }
}

/// An output's destination list, so the outputs themselves are the lists refined.
impl AsRef<[Rank]> for OutputSpec {
    fn as_ref(&self) -> &[Rank] {
        &self.dests
    }
}

/// What a broadcast must achieve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlanSpec {
    /// Communicator size.
    pub ranks: u32,
    /// The rank holding the task's outputs.
    pub root: Rank,
    /// Ranks left out of every tree (a set over `ranks` ranks).
    pub failed: RankSet,
    /// Shape of every tree.
    pub topology: Topology,
    /// How trees are formed.
    pub strategy: Strategy,
    /// The task's outputs, in order (output index = position).
    pub outputs: Vec<OutputSpec>,
}

impl PlanSpec {
    /// A spec with no output and no failed rank, binomial trees, per-class strategy.
    pub fn new(ranks: u32, root: Rank) -> Self {
        PlanSpec {
            ranks,
            root,
            failed: RankSet::new(ranks),
            topology: Topology::Binomial,
            strategy: Strategy::PerClass,
            outputs: Vec::new(),
        }
    }

    /// Sets the topology.
    pub fn with_topology(mut self, topology: Topology) -> Self {
        self.topology = topology;
        self
    }

    /// Sets the strategy.
    pub fn with_strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = strategy;
        self
    }

    /// Appends an output.
    pub fn with_output(mut self, output: OutputSpec) -> Self {
        self.outputs.push(output);
        self
    }

    /// Sets the failed ranks from a list, checking each is `< ranks`.
    pub fn with_failed(mut self, failed: &[Rank]) -> Result<Self, SpecError> {
        if let Some(&rank) = failed.iter().find(|&&r| r >= self.ranks) {
            return Err(SpecError::FailedOutOfRange {
                rank,
                ranks: self.ranks,
            });
        }
        self.failed = RankSet::from_ranks(self.ranks, failed.iter().copied());
        Ok(self)
    }

    /// Sets the failed ranks to everything `view` knows to be failed (`L_i ∪ pending`).
    pub fn with_failure_view(mut self, view: &FailureView) -> Result<Self, SpecError> {
        if view.size() != self.ranks {
            return Err(SpecError::FailedUniverse {
                universe: view.size(),
                ranks: self.ranks,
            });
        }
        self.failed = view.known_failed();
        Ok(self)
    }

    /// The index of the output named `name`.
    pub fn output_index(&self, name: &str) -> Result<usize, SpecError> {
        self.outputs
            .iter()
            .position(|o| o.name == name)
            .ok_or_else(|| SpecError::UnknownOutput {
                name: String::from(name),
            })
    }

    /// Checks the spec without building a plan.
    pub fn validate(&self) -> Result<(), SpecError> {
        self.partition().map(drop)
    }

    /// Validates the spec and refines its destinations into classes (failed destinations
    /// included; the plan separates them).
    pub(crate) fn partition(&self) -> Result<Partition, SpecError> {
        self.validate_header()?;
        refine_without(self.ranks, &self.outputs, self.root).map_err(|e| match e {
            RefineError::OutOfRange { list, rank } => SpecError::DestOutOfRange {
                output: String::from(&*self.outputs[list].name),
                rank,
                ranks: self.ranks,
            },
            RefineError::Duplicate { list, rank } => SpecError::DuplicateDest {
                output: String::from(&*self.outputs[list].name),
                rank,
            },
            // The root needs nothing from itself.
            RefineError::Outsider { list, rank } => SpecError::RootInDests {
                output: String::from(&*self.outputs[list].name),
                root: rank,
            },
            _ => SpecError::TooManyOutputs,
        })
    }

    fn validate_header(&self) -> Result<(), SpecError> {
        if self.root >= self.ranks {
            return Err(SpecError::RootOutOfRange {
                root: self.root,
                ranks: self.ranks,
            });
        }
        if self.failed.universe() != self.ranks {
            return Err(SpecError::FailedUniverse {
                universe: self.failed.universe(),
                ranks: self.ranks,
            });
        }
        if self.failed.contains(self.root) {
            return Err(SpecError::RootFailed { root: self.root });
        }
        if self.outputs.len() >= (u32::MAX - 1) as usize {
            return Err(SpecError::TooManyOutputs);
        }
        // A few names (the common task) are compared pairwise, which allocates nothing;
        // many go through a set.
        let pairwise = self.outputs.len() <= PAIRWISE_NAMES;
        let mut names: HashSet<&str> = HashSet::new();
        for (index, o) in self.outputs.iter().enumerate() {
            if o.name.is_empty() {
                return Err(SpecError::EmptyName { index });
            }
            let repeats = if pairwise {
                self.outputs[..index].iter().any(|p| p.name == o.name)
            } else {
                !names.insert(&*o.name)
            };
            if repeats {
                return Err(SpecError::DuplicateName {
                    name: String::from(&*o.name),
                });
            }
        }
        Ok(())
    }
}

/// A spec that cannot be planned. Every variant is a caller mistake in the spec.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SpecError {
    /// The root is not in `0..ranks`.
    RootOutOfRange {
        /// The root.
        root: Rank,
        /// The communicator size.
        ranks: u32,
    },
    /// The root is in the failed set.
    RootFailed {
        /// The root.
        root: Rank,
    },
    /// A failed rank is not in `0..ranks`.
    FailedOutOfRange {
        /// The rank.
        rank: Rank,
        /// The communicator size.
        ranks: u32,
    },
    /// The failed set belongs to a communicator of another size.
    FailedUniverse {
        /// The failed set's communicator size.
        universe: u32,
        /// The spec's.
        ranks: u32,
    },
    /// An output has an empty name.
    EmptyName {
        /// Its position in the output list.
        index: usize,
    },
    /// Two outputs share a name.
    DuplicateName {
        /// The name.
        name: String,
    },
    /// A name that no output of the spec has.
    UnknownOutput {
        /// The name.
        name: String,
    },
    /// A destination is not in `0..ranks`.
    DestOutOfRange {
        /// The output's name.
        output: String,
        /// The destination.
        rank: Rank,
        /// The communicator size.
        ranks: u32,
    },
    /// A destination list names the root.
    RootInDests {
        /// The output's name.
        output: String,
        /// The root.
        root: Rank,
    },
    /// A destination list names a rank twice.
    DuplicateDest {
        /// The output's name.
        output: String,
        /// The rank.
        rank: Rank,
    },
    /// More outputs than `u32::MAX - 1`.
    TooManyOutputs,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SpecError::RootOutOfRange { root, ranks } => {
                write!(f, "root {root} is out of range (ranks = {ranks})")
            }
            SpecError::RootFailed { root } => write!(f, "root {root} is in the failed set"),
            SpecError::FailedOutOfRange { rank, ranks } => {
                write!(f, "failed rank {rank} is out of range (ranks = {ranks})")
            }
            SpecError::FailedUniverse { universe, ranks } => write!(
                f,
                "failed set is over {universe} ranks but the spec has {ranks}"
            ),
            SpecError::EmptyName { index } => write!(f, "output #{index} has an empty name"),
            SpecError::DuplicateName { name } => {
                write!(f, "two outputs are named {name:?}")
            }
            SpecError::UnknownOutput { name } => write!(f, "no output is named {name:?}"),
            SpecError::DestOutOfRange {
                output,
                rank,
                ranks,
            } => write!(
                f,
                "output {output:?}: destination {rank} is out of range (ranks = {ranks})"
            ),
            SpecError::RootInDests { output, root } => write!(
                f,
                "output {output:?}: destination list names the root {root}"
            ),
            SpecError::DuplicateDest { output, rank } => {
                write!(f, "output {output:?}: destination {rank} is listed twice")
            }
            SpecError::TooManyOutputs => f.write_str("too many outputs"),
        }
    }
}

#[cfg(feature = "std")]
impl std::error::Error for SpecError {}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::ToString;
    use alloc::vec;

    fn spec() -> PlanSpec {
        PlanSpec::new(4, 0)
            .with_output(OutputSpec::new("A", 8, vec![1, 2]))
            .with_output(OutputSpec::new("B", 8, vec![2]))
    }

    #[test]
    fn each_mistake_has_its_own_error() {
        assert_eq!(spec().validate(), Ok(()));
        let mut s = spec();
        s.root = 4;
        assert_eq!(
            s.validate(),
            Err(SpecError::RootOutOfRange { root: 4, ranks: 4 })
        );
        let s = spec().with_failed(&[0]).unwrap();
        assert_eq!(s.validate(), Err(SpecError::RootFailed { root: 0 }));
        assert_eq!(
            spec().with_failed(&[4]),
            Err(SpecError::FailedOutOfRange { rank: 4, ranks: 4 })
        );
        let mut s = spec();
        s.failed = RankSet::new(5);
        assert!(matches!(
            s.validate(),
            Err(SpecError::FailedUniverse { .. })
        ));
        let s = spec().with_output(OutputSpec::new("", 1, vec![]));
        assert_eq!(s.validate(), Err(SpecError::EmptyName { index: 2 }));
        let s = spec().with_output(OutputSpec::new("A", 1, vec![]));
        assert_eq!(
            s.validate(),
            Err(SpecError::DuplicateName { name: "A".into() })
        );
        let s = spec().with_output(OutputSpec::new("C", 1, vec![3, 7]));
        assert_eq!(
            s.validate(),
            Err(SpecError::DestOutOfRange {
                output: "C".into(),
                rank: 7,
                ranks: 4
            })
        );
        let s = spec().with_output(OutputSpec::new("C", 1, vec![3, 0]));
        assert_eq!(
            s.validate(),
            Err(SpecError::RootInDests {
                output: "C".into(),
                root: 0
            })
        );
        let s = spec().with_output(OutputSpec::new("C", 1, vec![3, 1, 3]));
        assert_eq!(
            s.validate(),
            Err(SpecError::DuplicateDest {
                output: "C".into(),
                rank: 3
            })
        );
        assert_eq!(
            spec().output_index("Z"),
            Err(SpecError::UnknownOutput { name: "Z".into() })
        );
        assert_eq!(spec().output_index("B"), Ok(1));
        assert_eq!(
            SpecError::RootInDests {
                output: "C".into(),
                root: 0
            }
            .to_string(),
            "output \"C\": destination list names the root 0"
        );
    }

    #[test]
    fn strategy_names_round_trip() {
        for s in Strategy::ALL {
            assert_eq!(s.name().parse::<Strategy>(), Ok(s));
        }
        assert_eq!("merged".parse::<Strategy>(), Err(ParseStrategyError));
    }
}
