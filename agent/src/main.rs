//! `updraft`: the update daemon and its command-line client.

use std::process::ExitCode;

fn main() -> ExitCode {
    updraft::logging::init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match updraft::cli::parse(&args) {
        Ok(a) => updraft::cli::run(a),
        Err(e) => {
            eprintln!("{}", e.text());
            2
        }
    };
    ExitCode::from(code as u8)
}
