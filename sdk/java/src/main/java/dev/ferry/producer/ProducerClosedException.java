package dev.ferry.producer;

/** send after close. */
public final class ProducerClosedException extends ProducerException {
    public ProducerClosedException() { super("the producer is closed"); }
}
