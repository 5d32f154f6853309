package dev.ferry.producer;

/** A send that could not be queued. */
public class ProducerException extends RuntimeException {
    public ProducerException(String message) { super(message); }
}
