//! A row's place in the slot's stream: what `x-outbox-seq` shows and what a stream
//! destination's publishing id is made of. Pure data.

use pgwire_replication::Lsn;

/// A row's place in the stream: its transaction's commit LSN and its index in the transaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub commit_lsn: Lsn,
    pub index: u32,
}

impl Position {
    /// `x-outbox-seq`: fixed-width hex of the commit LSN and the index, so that comparing two
    /// values as strings orders them along the stream.
    pub fn seq(&self) -> String {
        format!("{:016X}-{:08X}", self.commit_lsn.as_u64(), self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seq_orders_along_the_stream() {
        let a = Position {
            commit_lsn: Lsn::from_u64(0xFF),
            index: 9,
        }
        .seq();
        let b = Position {
            commit_lsn: Lsn::from_u64(0x100),
            index: 0,
        }
        .seq();
        let c = Position {
            commit_lsn: Lsn::from_u64(0x100),
            index: 1,
        }
        .seq();
        assert!(a < b && b < c);
    }
}
