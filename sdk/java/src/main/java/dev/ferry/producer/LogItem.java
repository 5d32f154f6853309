package dev.ferry.producer;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * A log as ordered key-value contents, serialised as one JSON object
 * ({"k1":"v1","k2":"v2"}, in the order the contents were added).
 */
public final class LogItem {
    private final List<String[]> contents = new ArrayList<>();

    public LogItem pushBack(String key, String value) {
        contents.add(new String[] {key, value});
        return this;
    }

    public List<String[]> getContents() { return contents; }

    /** The JSON object, UTF-8, in one exact-size array. */
    public byte[] toJson() {
        int n = contents.size();
        byte[][] parts = new byte[n * 2][];
        int size = 2 + Math.max(n - 1, 0); // braces, commas
        for (int i = 0; i < n; i++) {
            parts[2 * i] = quoted(contents.get(i)[0]);
            parts[2 * i + 1] = quoted(contents.get(i)[1]);
            size += parts[2 * i].length + parts[2 * i + 1].length + 5; // 4 quotes and a colon
        }
        byte[] out = new byte[size];
        int o = 0;
        out[o++] = '{';
        for (int i = 0; i < n; i++) {
            if (i > 0) {
                out[o++] = ',';
            }
            out[o++] = '"';
            System.arraycopy(parts[2 * i], 0, out, o, parts[2 * i].length);
            o += parts[2 * i].length;
            out[o++] = '"';
            out[o++] = ':';
            out[o++] = '"';
            System.arraycopy(parts[2 * i + 1], 0, out, o, parts[2 * i + 1].length);
            o += parts[2 * i + 1].length;
            out[o++] = '"';
        }
        out[o] = '}';
        return out;
    }

    /** s escaped for a JSON string (without its quotes), UTF-8; most strings need no escaping and are encoded once. */
    static byte[] quoted(String s) {
        boolean plain = true;
        for (int i = 0; i < s.length() && plain; i++) {
            char c = s.charAt(i);
            plain = c >= 0x20 && c != '"' && c != '\\';
        }
        if (plain) {
            return s.getBytes(StandardCharsets.UTF_8);
        }
        StringBuilder sb = new StringBuilder(s.length() + 16);
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': sb.append("\\\""); break;
                case '\\': sb.append("\\\\"); break;
                case '\n': sb.append("\\n"); break;
                case '\r': sb.append("\\r"); break;
                case '\t': sb.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        sb.append(String.format("\\u%04x", (int) c));
                    } else {
                        sb.append(c);
                    }
            }
        }
        return sb.toString().getBytes(StandardCharsets.UTF_8);
    }
}
