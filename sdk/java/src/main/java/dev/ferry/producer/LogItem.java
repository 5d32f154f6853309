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

    /** The JSON object, UTF-8. */
    public byte[] toJson() {
        StringBuilder sb = new StringBuilder(64 + contents.size() * 32);
        sb.append('{');
        for (int i = 0; i < contents.size(); i++) {
            if (i > 0) {
                sb.append(',');
            }
            quote(sb, contents.get(i)[0]);
            sb.append(':');
            quote(sb, contents.get(i)[1]);
        }
        return sb.append('}').toString().getBytes(StandardCharsets.UTF_8);
    }

    static void quote(StringBuilder sb, String s) {
        sb.append('"');
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
        sb.append('"');
    }
}
