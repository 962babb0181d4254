//! Which block each I/O goes to and whether it reads or writes.

/// Direction of one I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dir {
    /// READ.
    Read,
    /// WRITE.
    Write,
}

/// A small, fast, seedable generator (splitmix64): offsets need spread,
/// not cryptographic quality.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`), by Lemire's multiply-shift.
    pub fn below(&mut self, n: u64) -> u64 {
        let wide = u128::from(self.next_u64()) * u128::from(n);
        u64::try_from(wide >> 64).unwrap_or(0)
    }
}

/// The I/O units of a job's region, in the order of `--rw`: sequential,
/// uniformly random, or (for a job that must touch each unit once, as a
/// verify pass) a pseudo-random permutation.
#[derive(Debug, Clone)]
pub struct Workload {
    units: u64,
    random: bool,
    read_percent: u8,
    rng: Rng,
    next: u64,
    /// For permutations: a multiplier coprime with `units`.
    stride: u64,
    /// For permutations: an offset.
    start: u64,
}

impl Workload {
    /// `units` units (> 0), random or sequential, with `read_percent`
    /// reads.
    pub fn new(units: u64, random: bool, read_percent: u8, seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let start = rng.below(units.max(1));
        Self {
            units: units.max(1),
            random,
            read_percent,
            rng,
            next: 0,
            stride: coprime_stride(units.max(1)),
            start,
        }
    }

    /// Units in the region.
    pub fn units(&self) -> u64 {
        self.units
    }

    /// The next I/O: direction and unit.
    pub fn next_io(&mut self) -> (Dir, u64) {
        let dir = match self.read_percent {
            100 => Dir::Read,
            0 => Dir::Write,
            p if self.rng.below(100) < u64::from(p) => Dir::Read,
            _ => Dir::Write,
        };
        let unit = if self.random {
            self.rng.below(self.units)
        } else {
            let unit = self.next;
            self.next = (self.next + 1) % self.units;
            unit
        };
        (dir, unit)
    }

    /// The `i`-th unit of a pass that touches every unit once: `i` itself
    /// when sequential, a fixed permutation of it when random.
    pub fn pass_unit(&self, i: u64) -> u64 {
        if self.random {
            let mixed = u128::from(i) * u128::from(self.stride) + u128::from(self.start);
            u64::try_from(mixed % u128::from(self.units)).unwrap_or(0)
        } else {
            i % self.units
        }
    }
}

/// A stride near `n / φ` that is coprime with `n`, so that
/// `i * stride mod n` visits every unit once, well spread.
fn coprime_stride(n: u64) -> u64 {
    if n <= 2 {
        return 1;
    }
    let mut s = u64::try_from((u128::from(n) * 0x9e37_79b9) >> 32)
        .unwrap_or(1)
        .max(1);
    while gcd(s, n) != 1 {
        s += 1;
    }
    s
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequential_wraps() {
        let mut w = Workload::new(3, false, 100, 1);
        let units: Vec<u64> = (0..5).map(|_| w.next_io().1).collect();
        assert_eq!(units, [0, 1, 2, 0, 1]);
    }

    #[test]
    fn random_stays_in_range_and_mixes() {
        let mut w = Workload::new(1000, true, 70, 7);
        let mut reads = 0;
        for _ in 0..10_000 {
            let (dir, unit) = w.next_io();
            assert!(unit < 1000);
            if dir == Dir::Read {
                reads += 1;
            }
        }
        assert!((6000..8000).contains(&reads), "{reads} reads of 10000");
    }

    #[test]
    fn a_pass_is_a_permutation() {
        for n in [1u64, 2, 3, 10, 64, 1000, 4096] {
            let w = Workload::new(n, true, 0, n);
            let mut seen = vec![false; usize::try_from(n).unwrap()];
            for i in 0..n {
                let u = usize::try_from(w.pass_unit(i)).unwrap();
                assert!(!seen[u], "unit {u} twice for n={n}");
                seen[u] = true;
            }
        }
    }
}
