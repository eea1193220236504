//! `nodeipam-cidrset-driver`: nodeipam-core's half of the differential against upstream's cidrset,
//! speaking the line protocol of `nodeipam_tests::differential::protocol` on stdin/stdout (the
//! same as `tests/upstream/cmd/cidrset-driver`), so a sequence can be replayed on both by hand:
//!
//! ```sh
//! nodeipam-cidrset-driver --print-seed 42 > /tmp/ops
//! diff <(nodeipam-cidrset-driver < /tmp/ops) <("$NODEIPAM_UPSTREAM_BIN/cidrset-driver" < /tmp/ops)
//! ```

use std::io::{BufRead, BufWriter, Write};

use clap::Parser;
use nodeipam_tests::differential::{CoreDriver, Op, generate, protocol::to_text};

/// Answers cidrset requests from stdin with nodeipam-core, or prints a seed's sequence.
#[derive(Debug, Parser)]
#[command(name = "nodeipam-cidrset-driver", version)]
struct Args {
    /// Print the requests of this seed's sequence instead of answering stdin.
    #[arg(long)]
    print_seed: Option<u64>,
}

fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let stdout = std::io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    if let Some(seed) = args.print_seed {
        out.write_all(to_text(&generate(seed)).as_bytes())?;
        return out.flush();
    }
    let mut driver = CoreDriver::new();
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let answer = match Op::parse(&line) {
            Some(op) => driver.answer(&op),
            None => "err bad-op".to_owned(),
        };
        writeln!(out, "{answer}")?;
    }
    out.flush()
}
