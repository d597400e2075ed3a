//! The whole per-rank stack ([`ft_bcast::RankStack`]: failure layer and broadcaster) as
//! a simulated rank, so scenarios can mix validations and broadcasts.
//!
//! [`SimStack`] is the stack plus what the simulator alone knows: the scenario's
//! broadcast actions, shared by every rank, to name the outputs a rank releases in the
//! report (the protocol itself carries output indices, never names). Validation
//! actions and failure-layer events go through the very code the failure layer uses on
//! its own (`impl SimRank for Node` in [`crate::failure`]).
//!
//! Broadcast `k` (the `k`-th broadcast action of the scenario, from 0) runs as task `k`;
//! only its root acts on the action, the other ranks are activated by frames. Output
//! `j` of broadcast `k` carries [`payload`]`(k, j, bytes)`, so tests can check what every
//! rank received byte for byte.

use std::sync::Arc;

use ft_bcast::{BcastEvent, RankStack, StackEvent, Strategy, Topology};
use ft_core::node::Node;
use ft_core::view::FailureView;
use ft_core::{
    BufferTooShort, Bytes, Filled, FrameError, Instant, Protocol, Rank, Slot, Transmit,
    TransmitParts,
};

use crate::engine::{Observation, RankSetup, SimRank};
use crate::failure::detector_config;
use crate::scenario::{ActionKind, Broadcast, Scenario};

use ft_core::rng::mix64 as mix;

fn payload_word(broadcast: u32, output: u32, word: u64) -> u64 {
    let key = (u64::from(broadcast) << 32) | u64::from(output);
    mix(mix(key ^ 0x5851_f42d_4c95_7f2d) ^ word.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// Byte `offset` of output `output` of broadcast `broadcast`: a fixed pseudo-random
/// function of the three, so any rank's copy can be checked against the source.
pub fn payload_byte(broadcast: u32, output: u32, offset: u64) -> u8 {
    (payload_word(broadcast, output, offset / 8) >> (8 * (offset % 8))) as u8
}

/// The `len` bytes of output `output` of broadcast `broadcast` (byte `i` is
/// [`payload_byte`]`(broadcast, output, i)`).
pub fn payload(broadcast: u32, output: u32, len: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(len as usize);
    let mut word = 0;
    while (bytes.len() as u64) < len {
        let w = payload_word(broadcast, output, word).to_le_bytes();
        let take = (len - bytes.len() as u64).min(8) as usize;
        bytes.extend_from_slice(&w[..take]);
        word += 1;
    }
    bytes
}

/// The scenario's broadcast actions, in order (index = broadcast number = task id).
pub fn broadcasts_of(scenario: &Scenario) -> Arc<[Broadcast]> {
    scenario
        .action_kinds()
        .into_iter()
        .filter_map(|(_, kind)| match kind {
            ActionKind::Broadcast(b) => Some(b),
            _ => None,
        })
        .collect()
}

/// One simulated rank: its [`RankStack`] and the scenario's broadcasts (shared).
#[derive(Debug)]
pub struct SimStack {
    stack: RankStack,
    broadcasts: Arc<[Broadcast]>,
}

impl SimStack {
    /// The stack for `setup`, started at time 0, naming outputs after `broadcasts`.
    pub fn new(setup: &RankSetup, broadcasts: Arc<[Broadcast]>) -> Self {
        SimStack {
            stack: RankStack::new(detector_config(setup), Instant::ZERO),
            broadcasts,
        }
    }

    /// The factory [`crate::engine::Sim::new`] takes, for `scenario`.
    pub fn factory(scenario: &Scenario) -> impl FnMut(&RankSetup) -> SimStack {
        let broadcasts = broadcasts_of(scenario);
        move |setup| SimStack::new(setup, Arc::clone(&broadcasts))
    }

    /// The rank's stack (e.g. `stack().broadcaster()?.output(task, j)`).
    pub fn stack(&self) -> &RankStack {
        &self.stack
    }

    /// The rank's stack, for application commands in tests.
    pub fn stack_mut(&mut self) -> &mut RankStack {
        &mut self.stack
    }

    /// The name of output `output` of broadcast `broadcast` (its index as text if the
    /// broadcast is not one of the scenario's, e.g. started by a test directly).
    pub fn output_name(&self, broadcast: u32, output: u32) -> String {
        self.broadcasts
            .get(broadcast as usize)
            .and_then(|b| b.outputs.get(output as usize))
            .map_or_else(|| output.to_string(), |o| o.name.to_string())
    }
}

impl Protocol for SimStack {
    type Event = StackEvent;

    fn handle_message(&mut self, now: Instant, from: Rank, bytes: &[u8]) -> Result<(), FrameError> {
        self.stack.handle_message(now, from, bytes)
    }
    fn place_payload(&mut self, now: Instant, from: Rank, head: &[u8], len: usize) -> Option<Slot> {
        self.stack.place_payload(now, from, head, len)
    }
    fn handle_message_placed(
        &mut self,
        now: Instant,
        from: Rank,
        head: &[u8],
        payload: Filled,
    ) -> Result<(), FrameError> {
        self.stack.handle_message_placed(now, from, head, payload)
    }
    fn placement_lost(&mut self, now: Instant, slot: Slot) {
        self.stack.placement_lost(now, slot);
    }
    fn handle_timeout(&mut self, now: Instant) {
        self.stack.handle_timeout(now);
    }
    fn poll_transmit(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<Transmit>, BufferTooShort> {
        self.stack.poll_transmit(now, buf)
    }
    fn poll_transmit_parts(
        &mut self,
        now: Instant,
        buf: &mut [u8],
    ) -> Result<Option<TransmitParts>, BufferTooShort> {
        self.stack.poll_transmit_parts(now, buf)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        self.stack.poll_timeout()
    }
    fn poll_event(&mut self) -> Option<StackEvent> {
        self.stack.poll_event()
    }
}

impl SimRank for SimStack {
    fn view(&self) -> &FailureView {
        self.stack.node().view()
    }

    fn is_stopped(&self) -> bool {
        self.stack.is_stopped()
    }

    fn supports(action: &ActionKind) -> Result<(), String> {
        match action {
            ActionKind::Broadcast(b) => {
                // The rest of the spec needs the communicator size: checked with the
                // scenario (`Scenario::check`) and again by the root when it starts.
                b.topology
                    .parse::<Topology>()
                    .map_err(|e| format!("broadcast: {e}, not {:?}", b.topology))?;
                b.strategy
                    .parse::<Strategy>()
                    .map_err(|e| format!("broadcast: {e}, not {:?}", b.strategy))?;
                Ok(())
            }
            validation => <Node as SimRank>::supports(validation),
        }
    }

    fn apply(&mut self, now: Instant, action: &ActionKind, index: u32) -> Result<(), String> {
        match action {
            ActionKind::Broadcast(b) => {
                let config = self.stack.broadcaster_config();
                if config.me != b.root {
                    return Ok(());
                }
                let spec = b.plan_spec(config.n)?;
                let payloads = spec
                    .outputs
                    .iter()
                    .enumerate()
                    .map(|(j, o)| Bytes::from(payload(index, j as u32, o.bytes)))
                    .collect::<Vec<_>>();
                self.stack
                    .start_broadcast(now, index.into(), Bytes::new(), spec, payloads)
                    .map_err(|e| e.to_string())
            }
            ActionKind::ValidateLocal => self
                .stack
                .validate_local(now)
                .map(|_| ())
                .map_err(|e| e.to_string()),
            ActionKind::ValidateGlobal => self
                .stack
                .validate_global(now)
                .map(|_| ())
                .map_err(|e| e.to_string()),
        }
    }

    fn observe(&self, now: Instant, event: &StackEvent) -> Option<Observation> {
        match event {
            StackEvent::Node(e) => <Node as SimRank>::observe(self.stack.node(), now, e),
            StackEvent::Bcast(BcastEvent::Released { task, outputs, .. }) => {
                // A scenario's broadcast is keyed by its action's index.
                let broadcast = u32::try_from(task.key).ok()?;
                Some(Observation::Received {
                    broadcast,
                    outputs: outputs
                        .iter()
                        .map(|j| self.output_name(broadcast, j))
                        .collect(),
                })
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payload_matches_payload_byte_and_differs_by_key() {
        let p = payload(3, 1, 21);
        assert_eq!(p.len(), 21);
        for (i, &b) in p.iter().enumerate() {
            assert_eq!(b, payload_byte(3, 1, i as u64));
        }
        assert_ne!(payload(3, 1, 64), payload(3, 2, 64));
        assert_ne!(payload(3, 1, 64), payload(4, 1, 64));
    }
}
