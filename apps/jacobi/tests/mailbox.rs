//! The mailbox on a simulated group, step by step: messages that come early are kept
//! for the iteration that asks for them, a repeated one is dropped, a
//! neighbour's death ends a wait as `NeighbourFailed` and another rank's as
//! `PeerFailed`, and events the solver does not act on are kept for the recovery.

use std::time::{Duration, Instant};

use ft::sim::SimGroup;
use ft::{Event, Settings};
use ft_jacobi::halo::{HaloError, Kind, Mailbox};
use ft_jacobi::strip::Side;

fn group(n: u32) -> SimGroup {
    let settings = Settings {
        period: Duration::from_millis(20),
        timeout: Duration::from_millis(300),
        ..Settings::default()
    };
    SimGroup::open(n, &settings).expect("a group")
}

fn deadline() -> Instant {
    Instant::now() + Duration::from_secs(20)
}

#[test]
fn early_messages_wait_for_their_iteration_and_repeated_ones_are_dropped() {
    let group = group(2);
    let sender = Mailbox::new(group.rank(0).unwrap(), deadline());
    let mut receiver = Mailbox::new(group.rank(1).unwrap(), deadline());
    let halo = |m: &Mailbox, i| m.tag(Kind::Halo, i, Side::Above);
    // Iteration 1's halo overtakes iteration 0's, and iteration 2's comes twice.
    sender.send(1, halo(&sender, 1), vec![1u8; 8]).unwrap();
    sender.send(1, halo(&sender, 0), vec![0u8; 8]).unwrap();
    let zero = receiver.receive(0, halo(&receiver, 0), &[0]).unwrap();
    assert_eq!(&zero[..], [0u8; 8]);
    let one = receiver.receive(0, halo(&receiver, 1), &[0]).unwrap();
    assert_eq!(&one[..], [1u8; 8]);
    sender.send(1, halo(&sender, 2), vec![2u8; 8]).unwrap();
    sender.send(1, halo(&sender, 2), vec![3u8; 8]).unwrap();
    sender.send(1, halo(&sender, 3), vec![4u8; 8]).unwrap();
    let three = receiver.receive(0, halo(&receiver, 3), &[0]).unwrap();
    assert_eq!(&three[..], [4u8; 8]);
    let two = receiver.receive(0, halo(&receiver, 2), &[0]).unwrap();
    assert_eq!(&two[..], [2u8; 8], "the first of the two, kept");
    assert_eq!(receiver.dropped(), 1, "the repeat");
}

#[test]
fn a_death_ends_the_wait_with_who_died() {
    let group = group(4);
    let mut mailbox = Mailbox::new(group.rank(1).unwrap(), deadline());
    let tag = mailbox.tag(Kind::Halo, 0, Side::Above);
    group.kill(3);
    assert_eq!(
        mailbox.receive(0, tag, &[0, 2]),
        Err(HaloError::PeerFailed(3))
    );
    group.kill(2);
    assert_eq!(
        mailbox.receive(0, tag, &[0, 2]),
        Err(HaloError::NeighbourFailed(2))
    );
    assert_eq!(mailbox.failed(), [3, 2]);
    // The survivors agree on G; the wait that takes the news keeps it for the recovery.
    std::thread::scope(|s| {
        for r in [0, 1] {
            let handle = group.rank(r).unwrap();
            s.spawn(move || handle.validate_global().expect("validated"));
        }
    });
    let mut later = Mailbox::new(
        group.rank(1).unwrap(),
        Instant::now() + Duration::from_millis(300),
    );
    let none = later.receive(0, tag, &[0]);
    assert!(matches!(none, Err(HaloError::TimedOut { .. })), "{none:?}");
    let others = later.take_others();
    assert!(
        others
            .iter()
            .any(|e| matches!(e, Event::Validated { failed, .. } if failed.contains(2) && failed.contains(3))),
        "{others:?}"
    );
}
