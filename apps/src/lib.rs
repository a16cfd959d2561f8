//! Programs built on spate's public API. The binaries in `src/bin/` are
//! declared by the root package (so integration tests can name them); their
//! logic lives here.

pub mod demo;
