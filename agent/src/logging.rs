//! Logging to stderr (minimal).

struct Stderr;

impl log::Log for Stderr {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Info
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            eprintln!("updraft[{}]: {}", r.level(), r.args());
        }
    }
    fn flush(&self) {}
}

pub fn init() {
    static L: Stderr = Stderr;
    if log::set_logger(&L).is_ok() {
        log::set_max_level(log::LevelFilter::Info);
    }
}
