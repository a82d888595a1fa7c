//! The PostgreSQL store (in progress).
