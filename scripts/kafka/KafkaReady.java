// Waits until a Kafka broker answers a metadata request, using the official client from the
// broker's own jars (run as a single-file program: java -cp 'lib/*' KafkaReady.java HOST:PORT SECONDS).
// Exits 0 once the cluster reports at least one broker, 1 when the deadline passes.
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;

public class KafkaReady {
    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(Long.parseLong(args[1]));
        Properties props = new Properties();
        props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(AdminClientConfig.REQUEST_TIMEOUT_MS_CONFIG, "3000");
        props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "3000");
        String last = "no attempt";
        try (Admin admin = Admin.create(props)) {
            while (System.nanoTime() < deadline) {
                try {
                    int brokers = admin.describeCluster().nodes().get(3, TimeUnit.SECONDS).size();
                    admin.listTopics().names().get(3, TimeUnit.SECONDS);
                    if (brokers > 0) {
                        System.out.println("kafka ready at " + bootstrap + " (" + brokers + " broker)");
                        return;
                    }
                    last = "metadata lists no broker";
                } catch (Exception e) {
                    last = e.toString();
                }
                Thread.sleep(500);
            }
        }
        System.err.println("kafka at " + bootstrap + " did not answer a metadata request: " + last);
        System.exit(1);
    }
}
