//! [`Tag`]: what a message of the solver carries, of which iteration and side, packed
//! into the message channel's `u64` tag with bit 63 clear.

use crate::strip::Side;

/// What a message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    /// An edge row for a neighbour's ghost.
    Halo = 1,
    /// A strip's row digests, for the reporting rank.
    Digests = 2,
    /// The reporting rank has the checksum: the job is over.
    Done = 3,
    /// Rows of a checkpoint, for their owner under a recovery's new layout (the
    /// iteration field names the checkpoint's owner).
    Restore = 4,
}

/// A message's tag: see the [halo module docs](super).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Tag {
    /// What it carries.
    pub kind: Kind,
    /// The iteration.
    pub iteration: u32,
    /// The receiver's ghost it fills ([`Side::Above`] for other kinds).
    pub side: Side,
}

impl Tag {
    /// The tag as it travels: kind in bits 56..63, iteration in 8..40, side in 0..8
    /// (bits 40..56 clear).
    pub fn encode(self) -> u64 {
        let side = match self.side {
            Side::Above => 0,
            Side::Below => 1,
        };
        (self.kind as u64) << 56 | u64::from(self.iteration) << 8 | side
    }

    /// The tag `raw` encodes, if it is one of ours.
    pub fn decode(raw: u64) -> Option<Tag> {
        let kind = match raw >> 56 {
            1 => Kind::Halo,
            2 => Kind::Digests,
            3 => Kind::Done,
            4 => Kind::Restore,
            _ => return None,
        };
        let side = match raw & 0xff {
            0 => Side::Above,
            1 => Side::Below,
            _ => return None,
        };
        if (raw >> 40) & 0xffff != 0 {
            return None;
        }
        Some(Tag {
            kind,
            iteration: (raw >> 8) as u32,
            side,
        })
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_and_keep_bit_63_clear() {
        for tag in [
            Tag {
                kind: Kind::Halo,
                iteration: 149,
                side: Side::Below,
            },
            Tag {
                kind: Kind::Done,
                iteration: u32::MAX,
                side: Side::Above,
            },
        ] {
            assert_eq!(Tag::decode(tag.encode()), Some(tag));
            assert_eq!(tag.encode() >> 63, 0);
        }
        assert_eq!(Tag::decode(0), None);
        assert_eq!(Tag::decode(1 << 56 | 2), None);
        assert_eq!(Tag::decode(1 << 56 | 1 << 40), None, "bits 40..56 set");
    }
}
