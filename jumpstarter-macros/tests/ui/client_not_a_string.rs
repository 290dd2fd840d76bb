use jumpstarter_macros::driver;

#[allow(dead_code)]
struct Power;

#[driver(client = PowerClient)]
impl Power {}

fn main() {}
