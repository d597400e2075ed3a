//! Rebuilding a simulated group from spares through the handles: four working ranks
//! and two spares; when a working rank dies, the survivors agree on `G` and rebuild,
//! the next spare is admitted under the dead rank's number in its next incarnation,
//! and the rebuilt group keeps its size and numbering, validates and carries messages;
//! the same rank failing again is replaced by the second spare, and with no spare left
//! a rebuild is refused with a typed error.

use std::time::Duration;

use ft::sim::SimGroup;
use ft::{Event, GroupError, Rank, Runtime, RuntimeError, Scope};

mod common;
use common::{settings, WAIT};

/// Runs `validate_global` on every handle, each on its own thread, until `G` holds
/// `want`; checks every handle agreed.
fn validate_until(handles: &[&Runtime], want: &[Rank]) {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "G never held {want:?}"
        );
        let gs: Vec<Vec<Rank>> = std::thread::scope(|s| {
            let threads: Vec<_> = handles
                .iter()
                .map(|h| s.spawn(move || h.validate_global().expect("validates")))
                .collect();
            threads
                .into_iter()
                .map(|t| t.join().unwrap().agreed.iter().collect())
                .collect()
        });
        assert!(gs.windows(2).all(|w| w[0] == w[1]), "uniform: {gs:?}");
        if gs[0] == want {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The spare's admission: the event on the handle it waits on, then its new handle.
fn admission(world: &Runtime) -> (Runtime, Rank, u32) {
    loop {
        match world.next_event(Some(WAIT)).expect("the spare runs") {
            Some(Event::Admitted {
                group,
                rank,
                generation,
            }) => {
                let handle = world.admitted(group).unwrap().expect("the new handle");
                assert!(world.admitted(group).unwrap().is_none(), "taken once");
                return (handle, rank, generation);
            }
            Some(_) => continue,
            None => panic!("no admission within {WAIT:?}"),
        }
    }
}

/// The next message of `handle`.
fn next_message(handle: &Runtime) -> (Rank, u64) {
    loop {
        match handle.next_event(Some(WAIT)).expect("the handle runs") {
            Some(Event::Message { from, tag, .. }) => return (from, tag),
            Some(_) => continue,
            None => panic!("no message within {WAIT:?}"),
        }
    }
}

#[test]
fn spares_take_failed_ranks_numbers_in_their_next_incarnation() {
    let group = SimGroup::open(6, &settings()).expect("a group");
    let world: Vec<&Runtime> = (0..6).map(|r| group.rank(r).unwrap()).collect();
    let team: Vec<Option<Runtime>> = world
        .iter()
        .map(|w| w.split_spares(2).expect("splits"))
        .collect();
    assert!(
        team[4].is_none() && team[5].is_none(),
        "ranks 4 and 5 are spares"
    );
    assert_eq!(team[3].as_ref().unwrap().view().size(), 4);

    // Rank 1 dies; the survivors agree and rebuild; spare 4 takes its number.
    group.kill(1);
    let survivors = [0usize, 2, 3];
    let handles: Vec<&Runtime> = survivors
        .iter()
        .map(|&r| team[r].as_ref().unwrap())
        .collect();
    validate_until(&handles, &[1]);
    let rebuilt: Vec<Runtime> = handles.iter().map(|h| h.rebuild().unwrap()).collect();
    for h in &rebuilt {
        assert_eq!(
            h.next_event(Some(WAIT)).unwrap(),
            Some(Event::Replaced {
                rank: 1,
                generation: 1
            })
        );
        assert_eq!(h.view().size(), 4, "the same size");
    }
    let (spare, rank, generation) = admission(world[4]);
    assert_eq!((rank, generation), (1, 1));
    assert!(matches!(
        spare.next_event(Some(WAIT)).unwrap(),
        Some(Event::Admitted { rank: 1, .. })
    ));
    let members: Vec<&Runtime> = vec![&rebuilt[0], &spare, &rebuilt[1], &rebuilt[2]];
    for (k, h) in members.iter().enumerate() {
        assert_eq!(h.view().rank(), k as Rank, "the same numbering");
    }
    validate_until(&members, &[]);
    let (info, _) = rebuilt[0].view().rank_info(Scope::Global, 1).unwrap();
    assert_eq!(info.generation, 1, "rank 1 is in its second incarnation");
    spare.send(3, 9, b"from the new rank 1".to_vec()).unwrap();
    assert_eq!(next_message(&rebuilt[2]), (1, 9));

    // The same rank fails again: spare 5 takes it, in its third incarnation.
    group.kill(4);
    let survivors: Vec<&Runtime> = vec![&rebuilt[0], &rebuilt[1], &rebuilt[2]];
    validate_until(&survivors, &[1]);
    let again: Vec<Runtime> = survivors.iter().map(|h| h.rebuild().unwrap()).collect();
    let (last, rank, generation) = admission(world[5]);
    assert_eq!((rank, generation), (1, 2));
    let members: Vec<&Runtime> = vec![&again[0], &last, &again[1], &again[2]];
    validate_until(&members, &[]);

    // No spare left: a third failure cannot be rebuilt.
    group.kill(3);
    let survivors: Vec<&Runtime> = vec![&again[0], &last, &again[1]];
    validate_until(&survivors, &[3]);
    assert!(matches!(
        again[0].rebuild(),
        Err(RuntimeError::Group(GroupError::NoSpares {
            needed: 1,
            left: 0
        }))
    ));
}
