//! [`Admission`]: what a spare learns when it takes a failed rank's number in a rebuilt
//! group, sent by every survivor as a control message over the group every rank started
//! in ([`ft_bcast::RankStack::send_control`]).
//!
//! Layout (varints, [`ft_core::wire`]'s): `comm`, `n`, then `n` transport ranks (the
//! group's map), `n` generations, then the count and the transport ranks of the spares
//! still unused. Decoding never panics: a message that is truncated, too long, names a
//! transport rank twice or out of range, or holds more than the transport's ranks is a
//! [`FrameError`].

use ft_core::wire::{Reader, Writer};
use ft_core::{FrameError, Rank};

/// A rebuilt group, as its new members need it: see the [module docs](self).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Admission {
    /// The group's communicator id.
    pub comm: u32,
    /// The transport rank of each of the group's ranks.
    pub ranks: Vec<Rank>,
    /// The incarnation of each of the group's ranks.
    pub generations: Vec<u32>,
    /// The spares not used yet, in the order later rebuilds take them.
    pub spares: Vec<Rank>,
}

impl Admission {
    /// The message's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::bare();
        w.put_varint(u64::from(self.comm))
            .put_varint(self.ranks.len() as u64);
        for &rank in &self.ranks {
            w.put_varint(u64::from(rank));
        }
        for &generation in &self.generations {
            w.put_varint(u64::from(generation));
        }
        w.put_varint(self.spares.len() as u64);
        for &rank in &self.spares {
            w.put_varint(u64::from(rank));
        }
        w.finish()
    }

    /// The admission `bytes` encode, on a transport of `size` ranks.
    pub fn decode(bytes: &[u8], size: u32) -> Result<Admission, FrameError> {
        let mut r = Reader::new(bytes, size);
        let comm = r.varint_u32()?;
        let n = r.varint_u32()?;
        if n == 0 || n > size {
            return Err(FrameError::Malformed("an admission of another size"));
        }
        let ranks = (0..n).map(|_| r.rank()).collect::<Result<Vec<_>, _>>()?;
        let generations = (0..n)
            .map(|_| r.varint_u32())
            .collect::<Result<Vec<_>, _>>()?;
        let left = r.varint_u32()?;
        if left > size {
            return Err(FrameError::Malformed("more spares than ranks"));
        }
        let spares = (0..left).map(|_| r.rank()).collect::<Result<Vec<_>, _>>()?;
        r.finish()?;
        let mut all: Vec<Rank> = ranks.iter().chain(&spares).copied().collect();
        all.sort_unstable();
        if all.windows(2).any(|w| w[0] == w[1]) {
            return Err(FrameError::Malformed("an admission names a rank twice"));
        }
        Ok(Admission {
            comm,
            ranks,
            generations,
            spares,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admissions_round_trip_and_bad_ones_are_refused() {
        let a = Admission {
            comm: 77,
            ranks: vec![0, 6, 2, 3],
            generations: vec![0, 1, 0, 0],
            spares: vec![7],
        };
        let bytes = a.encode();
        assert_eq!(Admission::decode(&bytes, 8), Ok(a.clone()));
        for cut in 0..bytes.len() {
            assert!(Admission::decode(&bytes[..cut], 8).is_err(), "cut at {cut}");
        }
        assert!(Admission::decode(&bytes, 6).is_err(), "rank 6 of 6");
        let twice = Admission {
            spares: vec![6],
            ..a
        };
        assert!(Admission::decode(&twice.encode(), 8).is_err());
        let mut long = bytes.clone();
        long.push(0);
        assert!(Admission::decode(&long, 8).is_err());
    }
}
