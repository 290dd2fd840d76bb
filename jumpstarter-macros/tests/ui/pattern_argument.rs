use jumpstarter_macros::driver;

#[allow(dead_code)]
struct Power;

#[driver(client = "jumpstarter_driver_power.client.PowerClient")]
impl Power {
    #[export]
    async fn set(&self, (volts, amps): (f64, f64)) -> Result<(), std::io::Error> {
        Ok(())
    }
}

fn main() {}
