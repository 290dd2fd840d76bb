//! The Jumpstarter router: pairs client and exporter streams and forwards frames (not built yet).
