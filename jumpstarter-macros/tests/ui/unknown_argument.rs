use jumpstarter_macros::driver;

#[allow(dead_code)]
struct Power;

#[driver(client = "jumpstarter_driver_power.client.PowerClient", kind = "power")]
impl Power {}

fn main() {}
