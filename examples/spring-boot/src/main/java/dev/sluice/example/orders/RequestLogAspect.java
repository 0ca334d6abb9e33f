package dev.sluice.example.orders;

import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import java.time.Instant;
import java.util.Map;
import java.util.Optional;
import java.util.UUID;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.atomic.AtomicLong;
import org.aspectj.lang.ProceedingJoinPoint;
import org.aspectj.lang.annotation.Around;
import org.aspectj.lang.annotation.Aspect;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;
import org.slf4j.MDC;
import org.springframework.http.ResponseEntity;
import org.springframework.stereotype.Component;
import org.springframework.web.context.request.RequestContextHolder;
import org.springframework.web.context.request.ServletRequestAttributes;

/**
 * Logs every API request: method, path, order id, status, duration, the request id (header
 * {@code X-Request-Id}, else a new UUID), a sequence number, and the MDC. The time the logging
 * took inside the request goes back in the response header {@code X-Log-Time-Us}.
 *
 * <p>In {@code sync-jdbc} mode it is the seed's code: the entry goes into a shared
 * {@link ConcurrentLinkedQueue}, and the request then drains the whole queue through the DAO
 * inside {@code synchronized (q)}, so one slow insert holds every request behind the lock.
 *
 * <p>In {@code sluice} mode it is one SLF4J call; logback's {@code SluiceAppender} (see
 * {@code logback-sluice.xml}) hands the record to the agent.
 */
@Aspect
@Component
public class RequestLogAspect {
    private static final Logger ACCESS = LoggerFactory.getLogger("access");
    private static final Logger LOG = LoggerFactory.getLogger(RequestLogAspect.class);

    private final LoggingMode mode;
    private final Optional<RequestLogDao> dao;
    private final ConcurrentLinkedQueue<LogDto> q = new ConcurrentLinkedQueue<>();
    private final AtomicLong sequence = new AtomicLong();

    public RequestLogAspect(LoggingMode mode, Optional<RequestLogDao> dao) {
        this.mode = mode;
        this.dao = dao;
        if (mode == LoggingMode.SYNC_JDBC && dao.isEmpty()) {
            throw new IllegalStateException("sync-jdbc mode without its DAO");
        }
    }

    @Around("execution(public * dev.sluice.example.orders.OrderController.*(..))")
    public Object logRequest(ProceedingJoinPoint call) throws Throwable {
        if (mode == LoggingMode.NONE) {
            return call.proceed();
        }
        HttpServletRequest request =
                ((ServletRequestAttributes) RequestContextHolder.currentRequestAttributes()).getRequest();
        String requestId = Optional.ofNullable(request.getHeader("X-Request-Id"))
                .filter(id -> !id.isBlank())
                .orElseGet(() -> UUID.randomUUID().toString());
        long seq = sequence.incrementAndGet();
        String client = Optional.ofNullable(request.getHeader("X-Client")).orElse(request.getRemoteAddr());
        MDC.put("request_id", requestId);
        MDC.put("seq", Long.toString(seq));
        MDC.put("client", client);
        long orderId = call.getArgs().length > 0 && call.getArgs()[0] instanceof Long id ? id : -1;
        long started = System.nanoTime();
        int status = 500;
        try {
            Object result = call.proceed();
            status = result instanceof ResponseEntity<?> entity ? entity.getStatusCode().value() : 200;
            return result;
        } finally {
            long ended = System.nanoTime();
            double durationMs = (ended - started) / 1e6;
            try {
                log(new LogDto(requestId, seq, request.getMethod(), request.getRequestURI(), orderId, status,
                        durationMs, Map.copyOf(MDC.getCopyOfContextMap()), Instant.now()));
                // What logging cost this request (the seed's lock and inserts, or Sluice's hand-off),
                // for the run script. The response is not committed yet: the body is written after.
                HttpServletResponse response =
                        ((ServletRequestAttributes) RequestContextHolder.currentRequestAttributes()).getResponse();
                if (response != null) {
                    response.setHeader("X-Log-Time-Us", Long.toString((System.nanoTime() - ended) / 1000));
                }
            } finally {
                MDC.remove("request_id");
                MDC.remove("seq");
                MDC.remove("client");
            }
        }
    }

    private void log(LogDto dto) {
        switch (mode) {
            case SYNC_JDBC -> {
                // The seed's aspect, as it was.
                q.add(dto);
                synchronized (q) {
                    while (!q.isEmpty()) {
                        LogDto next = q.poll();
                        try {
                            dao.get().insertLog(next);
                        } catch (RuntimeException e) {
                            LOG.warn("request log {} lost: {}", next.requestId(), e.toString());
                        }
                    }
                }
            }
            case SLUICE -> ACCESS.atInfo()
                    .addKeyValue("method", dto.method())
                    .addKeyValue("path", dto.path())
                    .addKeyValue("order_id", dto.orderId())
                    .addKeyValue("status", dto.status())
                    .addKeyValue("duration_ms", Math.round(dto.durationMs() * 1000) / 1000.0)
                    .log("{} {} -> {} in {} ms (request {} seq {})", dto.method(), dto.path(), dto.status(),
                            String.format("%.1f", dto.durationMs()), dto.requestId(), dto.seq());
            case NONE -> {}
        }
    }
}
