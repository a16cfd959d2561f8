//! spate-stack
