//! Random and malformed CDBs and parameter data, from several nexuses, must
//! never panic, every failure must map to CHECK CONDITION with a sense key
//! (or RESERVATION CONFLICT), and every success must stay within the
//! buffers and the capacity.

use std::sync::Arc;

use sqcq_scsi::{
    Completion, LogicalUnit, LuConfig, MediumOp, NexusId, Provisioning, ScsiError, SenseKey,
    Status, execute_absent,
};

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % u64::try_from(n).unwrap()).unwrap()
    }

    fn byte(&mut self) -> u8 {
        self.next().to_le_bytes()[0]
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.byte();
        }
    }
}

/// Opcodes worth hitting often: the supported ones and a few neighbours.
const OPCODES: [u8; 33] = [
    0x00, 0x03, 0x08, 0x0a, 0x12, 0x15, 0x1a, 0x1b, 0x25, 0x28, 0x2a, 0x2f, 0x35, 0x41, 0x42, 0x55,
    0x5a, 0x5e, 0x5f, 0x88, 0x8a, 0x8f, 0x91, 0x93, 0x9e, 0xa0, 0xa3, 0xa8, 0xaa, 0x7f, 0x04, 0x16,
    0x89,
];

fn lu(block_size: u32, provisioning: bool, read_only: bool) -> LogicalUnit {
    let mut c = LuConfig::new(block_size, 4096, 0x5000_0000_0000_00ab);
    c.read_only = read_only;
    c.max_transfer_blocks = 64;
    if provisioning {
        c.provisioning = Some(Provisioning {
            max_unmap_blocks: 2048,
            max_unmap_descriptors: 8,
            ..Provisioning::default()
        });
    }
    LogicalUnit::new(c).unwrap()
}

fn check_error(e: &ScsiError) {
    match e.status_and_sense() {
        (Status::CheckCondition, Some(s)) => {
            assert_ne!(s.key, SenseKey::NoSense, "{e:?}");
            assert_ne!(s.asc, 0, "{e:?}");
        }
        (Status::ReservationConflict, None) => {
            assert_eq!(*e, ScsiError::ReservationConflict);
        }
        other => panic!("{e:?} maps to {other:?}"),
    }
}

fn check_ok(lu: &LogicalUnit, c: &Completion<'_>, scratch: usize, data_out: &[u8]) {
    let bs = u64::from(lu.block_size());
    let end = lu.blocks() * bs;
    match *c {
        Completion::Good | Completion::ReportLuns(_) => {}
        Completion::Data { len } => assert!(len <= scratch),
        Completion::Medium(op) => match op {
            MediumOp::Read { offset, bytes, .. } | MediumOp::Write { offset, bytes, .. } => {
                assert!(bytes > 0 && offset + bytes <= end);
            }
            MediumOp::Flush { lba, blocks } => assert!(blocks > 0 && (lba + blocks) * bs <= end),
            MediumOp::WriteSame {
                offset,
                blocks,
                pattern,
                ..
            } => {
                assert!(offset + u64::from(blocks) * bs <= end);
                if let Some(p) = pattern {
                    assert_eq!(p.len(), usize::try_from(bs).unwrap());
                    assert!(p.len() <= data_out.len());
                }
            }
            MediumOp::Unmap(list) => {
                for r in list.iter() {
                    assert!(r.blocks > 0 && r.offset + r.bytes <= end);
                }
            }
        },
    }
}

fn random_cdb(rng: &mut Rng, cdb: &mut [u8; 32]) -> usize {
    rng.fill(cdb);
    if rng.below(4) == 0 {
        // Anything at all, of any length.
        return rng.below(33);
    }
    // Mostly valid: a known opcode, plausible byte 1, small fields, a clear
    // control byte, the fixed 32-byte CDB field of virtio-scsi.
    let opcode = OPCODES[rng.below(OPCODES.len())];
    cdb[0] = opcode;
    let len = match opcode >> 5 {
        0 => 6,
        1 | 2 => 10,
        4 => 16,
        _ => 12,
    };
    for b in cdb.iter_mut().take(len - 1).skip(2) {
        match rng.below(8) {
            0..=4 => *b = 0,
            5 | 6 => *b &= 0x03,
            _ => {}
        }
    }
    cdb[1] = match opcode {
        0x9e => 0x10,
        0xa3 => [0x0a, 0x0c, 0x2a][rng.below(3)],
        0x5e => u8::try_from(rng.below(4)).unwrap(),
        0x5f => u8::try_from(rng.below(8)).unwrap(),
        _ => cdb[1] & [0x00, 0x01, 0x08, 0x10, 0x18][rng.below(5)],
    };
    if rng.below(8) != 0 {
        cdb[len - 1] = 0;
    }
    if rng.below(8) == 0 { rng.below(33) } else { 32 }
}

fn random_data_out(rng: &mut Rng, buf: &mut [u8; 700]) -> usize {
    rng.fill(buf);
    let len = rng.below(buf.len() + 1);
    match rng.below(4) {
        // A plausible UNMAP or MODE SELECT header.
        0 if len >= 8 => {
            buf[0] = 0;
            buf[2] = 0;
            buf[3] &= 0x70;
        }
        // A plausible PR OUT list with small keys.
        1 if len >= 24 => {
            buf[..7].fill(0);
            buf[8..15].fill(0);
            buf[0x7] &= 3;
            buf[15] &= 3;
            buf[20] = 0;
        }
        _ => {}
    }
    len
}

#[test]
fn random_cdbs_never_panic() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let units = [
        lu(512, true, false),
        lu(4096, false, false),
        lu(512, true, true),
    ];
    for u in &units {
        u.add_nexus(NexusId(1));
        u.add_nexus(NexusId(2));
    }
    let mut cdb = [0u8; 32];
    let mut out = [0u8; 700];
    let mut scratch = vec![0u8; sqcq_scsi::DATA_IN_LEN];
    let (mut ok, mut err) = (0u32, 0u32);
    for i in 0..60_000u32 {
        let lu = &units[rng.below(units.len())];
        let nexus = NexusId(1 + u64::try_from(rng.below(3)).unwrap());
        let cdb_len = random_cdb(&mut rng, &mut cdb);
        let out_len = random_data_out(&mut rng, &mut out);
        let scratch_len = if rng.below(8) == 0 {
            rng.below(64)
        } else {
            scratch.len()
        };
        let data_in = &mut scratch[..scratch_len];
        match lu.execute(nexus, &cdb[..cdb_len], &out[..out_len], data_in) {
            Ok(c) => {
                ok += 1;
                check_ok(lu, &c, scratch_len, &out[..out_len]);
            }
            Err(e) => {
                err += 1;
                check_error(&e);
            }
        }
        match execute_absent(&cdb[..cdb_len], &mut scratch[..scratch_len]) {
            Ok(Completion::Data { len }) => assert!(len <= scratch_len),
            Ok(Completion::ReportLuns(_)) => {}
            Ok(other) => panic!("absent LUN completed with {other:?}"),
            Err(e) => check_error(&e),
        }
        // Now and then the control path acts too.
        match i % 5000 {
            1000 => lu.reset(),
            2000 => lu
                .resize(1 + u64::try_from(rng.below(8192)).unwrap())
                .unwrap(),
            3000 => lu.luns_changed(),
            4000 => lu.nexus_loss(nexus),
            _ => {}
        }
    }
    // Both outcomes were exercised heavily.
    assert!(ok > 2_000 && err > 2_000, "ok {ok} err {err}");
}

#[test]
fn concurrent_workers_and_control_path() {
    let lu = Arc::new(lu(512, true, false));
    let workers: Vec<_> = (0..3u64)
        .map(|t| {
            let lu = Arc::clone(&lu);
            std::thread::spawn(move || {
                let mut rng = Rng(0x1234 + t);
                let mut cdb = [0u8; 32];
                let mut out = [0u8; 700];
                let mut scratch = [0u8; 512];
                for _ in 0..5_000 {
                    let cdb_len = random_cdb(&mut rng, &mut cdb);
                    let out_len = random_data_out(&mut rng, &mut out);
                    match lu.execute(NexusId(t), &cdb[..cdb_len], &out[..out_len], &mut scratch) {
                        Ok(c) => check_ok(&lu, &c, scratch.len(), &out[..out_len]),
                        Err(e) => check_error(&e),
                    }
                }
            })
        })
        .collect();
    for i in 0..200u64 {
        lu.resize(4096 + i * 16).unwrap(); // only grows: checks race with it
        lu.add_nexus(NexusId(i % 3));
        if i % 50 == 0 {
            lu.reset();
        }
    }
    for w in workers {
        w.join().unwrap();
    }
}
