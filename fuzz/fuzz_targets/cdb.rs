//! `LogicalUnit::execute` on arbitrary CDBs and parameter data.
//!
//! Input: `[flags: u8]` (bit 0: thin provisioning, bit 1: read-only), then
//! `[nexus: u8][cdb_len: u8][data_in_len: u16 le][cdb..][data_out..]`,
//! repeated: each record is one command to the same logical unit, so
//! state-changing commands (MODE SELECT, PR OUT, ...) feed later ones.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sqcq_scsi::{Completion, DATA_IN_LEN, LogicalUnit, LuConfig, NexusId, Provisioning};

/// NAA IEEE Registered (type 5), as `LuConfig::validate` requires.
const WWN: u64 = 0x5001_4050_0000_0001;

fuzz_target!(|data: &[u8]| {
    let Some((&flags, mut rest)) = data.split_first() else {
        return;
    };
    let mut config = LuConfig::new(512, 2048, WWN);
    if flags & 1 != 0 {
        config.provisioning = Some(Provisioning::default());
    }
    config.read_only = flags & 2 != 0;
    let lu = LogicalUnit::new(config).expect("valid config");
    let mut data_in = vec![0u8; DATA_IN_LEN + 64];
    for _ in 0..8 {
        let [nexus, cdb_len, l0, l1, tail @ ..] = rest else {
            break;
        };
        let cdb_len = usize::from(*cdb_len % 33).min(tail.len());
        let (cdb, tail) = tail.split_at(cdb_len);
        // Data-out runs up to the next 0xFF 0xFE marker (or the end).
        let out_len = tail
            .windows(2)
            .position(|w| w == [0xFF, 0xFE])
            .unwrap_or(tail.len());
        let (data_out, tail) = tail.split_at(out_len);
        rest = tail.get(2..).unwrap_or(&[]);
        let in_len = usize::from(u16::from_le_bytes([*l0, *l1])) % (data_in.len() + 1);
        let buf = &mut data_in[..in_len];
        match lu.execute(NexusId(u64::from(*nexus % 4)), cdb, data_out, buf) {
            Ok(Completion::Data { len }) => {
                assert!(len <= in_len, "Data {{ len: {len} }} > data-in buffer {in_len}");
            }
            Ok(_) => {}
            Err(e) => {
                let (_status, sense) = e.status_and_sense();
                let _ = format!("{e} {sense:?}");
            }
        }
    }
});
