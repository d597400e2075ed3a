//! The redundant stores of a small group under arbitrary input: every rank runs a
//! `Store`; the input puts entries, delivers the stores' messages in order per pair or
//! drops them, forges store messages with arbitrary tags and bytes, kills ranks and
//! makes the survivors decide commits on a `G` that did or did not grow. Nothing may
//! panic; malformed messages are typed errors; every survivor makes the same decision;
//! and a committed copy of an owner that no forged message named is, byte for byte,
//! what that owner put at that version.
#![no_main]

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use arbitrary::Arbitrary;
use ft_bcast::store::Store;
use ft_bcast::STORE_TAG;
use ft_core::{Bytes, Rank, RankSet};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Step {
    Put {
        rank: u8,
        key: u8,
        len: u8,
    },
    Deliver {
        from: u8,
        to: u8,
    },
    Drop {
        from: u8,
        to: u8,
    },
    Forge {
        to: u8,
        from: u8,
        kind: u8,
        bytes: Vec<u8>,
    },
    Kill {
        rank: u8,
    },
    Decide,
    Rebase,
}

#[derive(Arbitrary, Debug)]
struct Input {
    n: u8,
    span: u8,
    steps: Vec<Step>,
}

fn entry(owner: Rank, key: u64, version: u64, len: usize) -> Bytes {
    Bytes::from(
        (0..len)
            .map(|i| (i as u64 ^ key ^ version.wrapping_mul(31) ^ u64::from(owner)) as u8)
            .collect::<Vec<u8>>(),
    )
}

fuzz_target!(|input: Input| {
    let n = u32::from(input.n % 7) + 2;
    let span = u32::from(input.span % 4);
    let mut stores: Vec<Store> = (0..n)
        .map(|me| Store::new(n, me, span, RankSet::new(n)))
        .collect();
    let mut alive = vec![true; n as usize];
    // Messages in flight per (from, to), in order.
    let mut wires: BTreeMap<(Rank, Rank), VecDeque<(u64, Bytes)>> = BTreeMap::new();
    let mut forged: BTreeSet<Rank> = BTreeSet::new();
    let mut version = 1u64;
    let mut dead = RankSet::new(n);
    // What each owner put at the current version: (owner, key) → len.
    let mut puts: BTreeMap<(Rank, u64), usize> = BTreeMap::new();
    for step in input.steps {
        // Collect what the stores want to send.
        for (from, store) in stores.iter_mut().enumerate() {
            while let Some(m) = store.poll_outgoing() {
                assert!(m.tag & STORE_TAG != 0);
                wires
                    .entry((from as Rank, m.to))
                    .or_default()
                    .push_back((m.tag, m.bytes));
            }
        }
        match step {
            Step::Put { rank, key, len } => {
                let rank = u32::from(rank) % n;
                if alive[rank as usize] {
                    let key = u64::from(key % 4);
                    let len = usize::from(len);
                    stores[rank as usize].put(key, version, entry(rank, key, version, len));
                    puts.insert((rank, key), len);
                }
            }
            Step::Deliver { from, to } => {
                let (from, to) = (u32::from(from) % n, u32::from(to) % n);
                if let Some((tag, bytes)) = wires.get_mut(&(from, to)).and_then(|w| w.pop_front()) {
                    if alive[from as usize] && alive[to as usize] {
                        let result = stores[to as usize].handle_message(from, tag, bytes);
                        // A forged message can take the place of a real one in a pair.
                        if !forged.contains(&from) {
                            result.expect("the stores' own messages are well formed");
                        }
                    }
                }
            }
            Step::Drop { from, to } => {
                // A dropped message is a dead sender's: only drop from the dead.
                let (from, to) = (u32::from(from) % n, u32::from(to) % n);
                if !alive[from as usize] {
                    wires.remove(&(from, to));
                }
            }
            Step::Forge {
                to,
                from,
                kind,
                bytes,
            } => {
                let (from, to) = (u32::from(from) % n, u32::from(to) % n);
                forged.insert(from);
                let tag = STORE_TAG | u64::from(kind % 5);
                let _ = stores[to as usize].handle_message(from, tag, Bytes::from(bytes));
            }
            Step::Kill { rank } => {
                let rank = u32::from(rank) % n;
                if alive[rank as usize] && alive.iter().filter(|a| **a).count() > 1 {
                    alive[rank as usize] = false;
                    dead.insert(rank);
                    for (me, store) in stores.iter_mut().enumerate() {
                        if alive[me] {
                            store.on_rank_failed(rank);
                        }
                    }
                }
            }
            Step::Rebase => {
                for (me, store) in stores.iter_mut().enumerate() {
                    if alive[me] {
                        store.rebase(dead.clone());
                    }
                }
                puts.clear();
            }
            Step::Decide => {
                let flushed = stores
                    .iter()
                    .enumerate()
                    .all(|(me, s)| !alive[me] || s.flushed(version));
                if !flushed {
                    continue;
                }
                let agreed = dead.clone();
                let decisions: Vec<bool> = stores
                    .iter_mut()
                    .enumerate()
                    .filter(|(me, _)| alive[*me])
                    .map(|(_, s)| s.decide(version, &agreed))
                    .collect();
                assert!(decisions.windows(2).all(|w| w[0] == w[1]), "uniform");
                if decisions.first() == Some(&true) {
                    for (&(owner, key), &len) in &puts {
                        if forged.contains(&owner) {
                            continue;
                        }
                        for (me, store) in stores.iter().enumerate() {
                            if let Some((v, bytes)) = store.get(owner, key) {
                                if v == version && alive[me] {
                                    assert!(bytes == entry(owner, key, version, len));
                                }
                            }
                        }
                    }
                }
                version += 1;
                puts.clear();
            }
        }
    }
});
