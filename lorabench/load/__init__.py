"""What is sent: the model and adapters, each request's adapter and prompt, synthetic and
imported traces."""
