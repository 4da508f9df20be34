//! What every benchmark program prints beside its figures: the machine's fsync floor.
//! (A folder with `mod.rs`, so Cargo does not take it for a benchmark of its own.)

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// Median of one `write + fsync` of 512 bytes, 200 samples, in `dir`: the least one
/// durable commit can cost here.
pub fn fsync_floor(dir: &Path) -> Duration {
    let path = dir.join("fsync-probe");
    let mut f = std::fs::File::create(&path).expect("probe file");
    let mut samples: Vec<Duration> = (0..200)
        .map(|_| {
            let t = Instant::now();
            f.write_all(&[0u8; 512]).expect("write");
            f.sync_all().expect("fsync");
            t.elapsed()
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}
