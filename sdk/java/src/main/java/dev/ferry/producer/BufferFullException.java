package dev.ferry.producer;

/** totalSizeInBytes stayed full for maxBlockMs: the record was not queued. */
public final class BufferFullException extends ProducerException {
    public BufferFullException(String message) { super(message); }
}
