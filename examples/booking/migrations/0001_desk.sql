-- The desk service: guests' wallets and their bookings (one payment per booking, ever).
CREATE TABLE wallets (guest text PRIMARY KEY, balance int NOT NULL CHECK (balance >= 0));
CREATE TABLE bookings (
    booking_id uuid PRIMARY KEY,
    guest      text NOT NULL,
    nights     int  NOT NULL,
    paid       boolean NOT NULL DEFAULT false,
    cancelled  boolean NOT NULL DEFAULT false
);
