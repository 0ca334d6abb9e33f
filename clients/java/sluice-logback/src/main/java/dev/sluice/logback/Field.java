package dev.sluice.logback;

/**
 * A field added to every record, from the configuration:
 *
 * <pre>{@code
 * <field><name>service</name><value>checkout</value></field>
 * }</pre>
 */
public class Field {
    private String name;
    private String value;

    public Field() {}

    public Field(String name, String value) {
        this.name = name;
        this.value = value;
    }

    public String getName() {
        return name;
    }

    public void setName(String name) {
        this.name = name;
    }

    public String getValue() {
        return value;
    }

    public void setValue(String value) {
        this.value = value;
    }
}
