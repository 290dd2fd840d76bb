use jumpstarter_macros::driver;

#[allow(dead_code)]
struct Power;

#[driver(client = "jumpstarter_driver_power.client.PowerClient")]
impl Power {
    #[export(bidirectional)]
    async fn on(&self) -> Result<(), std::io::Error> {
        Ok(())
    }
}

fn main() {}
