//! The admission a rebuilt group sends its new members, under arbitrary input: bytes of
//! any kind on a transport of any size, and admissions built from arbitrary fields.
//! Decoding never panics; what it accepts holds as many generations as ranks, names
//! each transport rank at most once and only below the size, and encodes to bytes that
//! decode to the same admission; an admission that is well formed decodes to itself,
//! and every strict prefix of its bytes, or its bytes with one more byte, is refused.
#![no_main]

use std::collections::BTreeSet;

use arbitrary::Arbitrary;
use ft_runtime::groups::Admission;
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Input {
    /// Bytes from a peer, decoded on a transport of `size` ranks.
    Bytes { size: u16, bytes: Vec<u8> },
    /// An admission made of these fields: the group is a choice of distinct transport
    /// ranks, the spares the rest of a choice.
    Built {
        size: u16,
        comm: u32,
        picks: Vec<u16>,
        generations: Vec<u32>,
        members: u8,
        extra: u8,
    },
}

fn check_accepted(a: &Admission, size: u32) {
    assert!(!a.ranks.is_empty() && a.ranks.len() as u32 <= size);
    assert_eq!(a.ranks.len(), a.generations.len());
    let all: BTreeSet<u32> = a.ranks.iter().chain(&a.spares).copied().collect();
    assert_eq!(all.len(), a.ranks.len() + a.spares.len(), "a rank named twice");
    assert!(all.iter().all(|&r| r < size), "a rank out of range");
    let again = Admission::decode(&a.encode(), size).expect("an accepted admission re-encodes");
    assert_eq!(&again, a);
}

fuzz_target!(|input: Input| match input {
    Input::Bytes { size, bytes } => {
        let size = u32::from(size);
        if let Ok(a) = Admission::decode(&bytes, size) {
            check_accepted(&a, size);
        }
    }
    Input::Built { size, comm, picks, generations, members, extra } => {
        let size = u32::from(size % 512) + 1;
        let mut seen = BTreeSet::new();
        let chosen: Vec<u32> = picks
            .iter()
            .map(|&p| u32::from(p) % size)
            .filter(|&r| seen.insert(r))
            .collect();
        if chosen.is_empty() {
            return;
        }
        let n = (usize::from(members) % chosen.len()) + 1;
        let admission = Admission {
            comm,
            ranks: chosen[..n].to_vec(),
            generations: (0..n).map(|i| generations.get(i).copied().unwrap_or(0)).collect(),
            spares: chosen[n..].to_vec(),
        };
        let bytes = admission.encode();
        assert_eq!(Admission::decode(&bytes, size), Ok(admission.clone()));
        for cut in 0..bytes.len() {
            assert!(Admission::decode(&bytes[..cut], size).is_err(), "a prefix of {cut} bytes");
        }
        let mut long = bytes;
        long.push(extra);
        assert!(Admission::decode(&long, size).is_err(), "one byte too many");
    }
});
