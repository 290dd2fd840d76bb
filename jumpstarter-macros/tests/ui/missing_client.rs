use jumpstarter_macros::driver;

#[allow(dead_code)]
struct Power;

#[driver]
impl Power {}

fn main() {}
