//! Messages between the ranks of a simulated group, end to end through the handles:
//! each sender's messages arrive in the order it sent them, whole, however many
//! fragments they take; a send to a rank known dead is refused with a typed error; once
//! a rank is known dead, nothing more from it is delivered.

use std::collections::BTreeMap;
use std::time::Duration;

use ft::ft_core::SendError;
use ft::sim::SimGroup;
use ft::{Event, Rank, RuntimeError, StackError};

mod common;
use common::{next_message, settings, WAIT};

/// Message `k` of `from`: from 1 byte to 300 KiB (several fragments).
fn message(from: Rank, k: u64) -> Vec<u8> {
    let len = [1usize, 64, 5000, 70_000, 300 << 10][k as usize % 5];
    (0..len)
        .map(|i| (i as u64 * 31 + k * 7 + u64::from(from)) as u8)
        .collect()
}

#[test]
fn each_senders_messages_arrive_in_order_and_whole() {
    const COUNT: u64 = 30;
    let group = SimGroup::open(4, &settings()).expect("a group");
    std::thread::scope(|s| {
        for from in [0, 2, 3] {
            let handle = group.rank(from).unwrap();
            s.spawn(move || {
                for k in 0..COUNT {
                    handle.send(1, k, message(from, k)).expect("sent");
                }
            });
        }
    });
    let receiver = group.rank(1).unwrap();
    let mut next: BTreeMap<Rank, u64> = BTreeMap::new();
    for _ in 0..3 * COUNT {
        let (from, tag, bytes) = next_message(receiver);
        let k = next.entry(from).or_default();
        assert_eq!(tag, *k, "from {from}: in the order sent");
        assert!(
            bytes == message(from, tag),
            "from {from}: message {tag} whole"
        );
        *k += 1;
    }
    assert_eq!(next.values().collect::<Vec<_>>(), [&COUNT; 3]);
    // A rank may send to itself.
    receiver.send(1, 77, vec![1, 2, 3]).unwrap();
    assert_eq!(next_message(receiver), (1, 77, vec![1, 2, 3]));
}

#[test]
fn a_dead_rank_gets_nothing_and_sends_nothing_more() {
    let group = SimGroup::open(4, &settings()).expect("a group");
    let (sender, receiver) = (group.rank(3).unwrap(), group.rank(1).unwrap());
    sender.send(1, 1, vec![9; 100]).unwrap();
    assert_eq!(next_message(receiver), (3, 1, vec![9; 100]));
    // Rank 3 dies with a large message in flight.
    sender.send(1, 2, vec![8; 2 << 20]).unwrap();
    group.kill(3);
    let mut messages_after_death = 0;
    let mut told = false;
    while !told {
        match receiver.next_event(Some(WAIT)).unwrap() {
            Some(Event::RankFailed { rank: 3 }) => told = true,
            Some(Event::Message { from: 3, .. }) => {}
            Some(_) => {}
            None => panic!("rank 3's death was never reported"),
        }
    }
    while let Some(event) = receiver
        .next_event(Some(Duration::from_millis(300)))
        .unwrap()
    {
        messages_after_death += usize::from(matches!(event, Event::Message { from: 3, .. }));
    }
    assert_eq!(
        messages_after_death, 0,
        "nothing from rank 3 once it is known dead"
    );
    let refused = receiver.send(3, 5, vec![1]);
    assert!(
        matches!(
            refused,
            Err(RuntimeError::Stack(StackError::Send(SendError::DeadRank(
                3
            ))))
        ),
        "{refused:?}"
    );
    assert!(matches!(
        receiver.send(9, 5, vec![1]),
        Err(RuntimeError::Stack(StackError::Send(
            SendError::RankOutOfRange { rank: 9, n: 4 }
        )))
    ));
}
