use jumpstarter_macros::driver;

#[allow(dead_code)]
struct Composite;

#[driver(client = "jumpstarter_driver_composite.client.CompositeClient", children = "kids")]
impl Composite {}

fn main() {}
