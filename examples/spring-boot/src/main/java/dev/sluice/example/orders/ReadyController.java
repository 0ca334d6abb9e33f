package dev.sluice.example.orders;

import org.springframework.web.bind.annotation.GetMapping;
import org.springframework.web.bind.annotation.RestController;

/** For the run script: answers once the app serves requests. Not logged (not an API). */
@RestController
public class ReadyController {
    private final LoggingMode mode;

    public ReadyController(LoggingMode mode) {
        this.mode = mode;
    }

    @GetMapping("/ready")
    public String ready() {
        return "ready " + mode.name().toLowerCase().replace('_', '-') + "\n";
    }
}
