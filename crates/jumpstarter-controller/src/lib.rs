//! The Jumpstarter controller: inventory, authentication and lease scheduling (not built yet).
